"""Signals: a step with ``wait_for`` runs once a machine sends its job a named signal.

A waiting step is claimed like any other; in the claim's transaction it either finds its signal
stored (sent before it waited) and runs, or parks: ``awaiting_signal`` with no lease and no
message, its attempt not counted, a ``signal_waits`` row saying when it times out. Only
PostgreSQL knows it waits, so a Redis flush meanwhile loses nothing. ``send_signal`` stores the
signal (once per name: ``job_signals``' key) and sets the steps parked for it ``pending``, for
the caller to send after its commit. The job stays ``running``: a signal is a machine's step
in the work, not a person's decision.

A claim parking its step and a signal arriving can cross: the signal's transaction looks for
parked steps before the claim commits its park, and the claim looked for the signal before the
signal committed. The elected beat replica closes that gap on every tick
(``resume_signalled``), and there carries out the timeouts too (``expire_waits``): ``fail``
fails the step for good as ``signal_timeout``; ``continue`` sends it on, ``signals.<name>``
reading ``null``.

Functions flush; the caller commits, then sends the plans they return.
"""

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, literal, select
from sqlalchemy.dialects.postgresql import UUID, insert
from sqlalchemy.orm import Session

from service.catalogue.notices import record_event
from service.engine.completion import record_failure
from service.engine.jobs import missing_job
from service.engine.steps import StepKey
from service.language.plan import JobPlan, steps_plan
from service.language.profiles import Profile
from service.language.snapshots import job_profile
from service.language.specs import WaitForSpec
from service.platform.constants import SHARD_NONE
from service.platform.errors import JobConflict, SignalAlreadyReceived, SignalNotAwaited
from service.platform.models import JobRow, JobSignalRow, SignalWaitRow, StepRunRow
from service.platform.states import JOB_FINAL, StepStatus

SIGNAL_TIMEOUT = "signal_timeout"
EXPIRE_BATCH = 100


def signalled(session: Session, row: StepRunRow, spec: WaitForSpec, now: datetime) -> bool:
    """Whether a held step that waits for a signal may run: its signal is stored, or its wait
    timed out and goes on. Otherwise it parks. Called with the step's row locked and its lease
    just taken, so two deliveries cannot both park it."""
    if _stored(session, row.job_id, spec.signal) or _waited_out(session, row.job_id, row.step_id):
        return True
    park(session, row, spec, now)
    return False


def park(session: Session, row: StepRunRow, spec: WaitForSpec, now: datetime) -> None:
    """The step waits without its lease; a wait already recorded keeps its deadline."""
    row.status = StepStatus.AWAITING_SIGNAL
    row.attempts -= 1
    row.started_at = None
    row.lease_token = None
    row.lease_until = None
    due = now + timedelta(seconds=spec.timeout_s)
    session.execute(
        insert(SignalWaitRow)
        .values(
            job_id=row.job_id,
            step_id=row.step_id,
            signal=spec.signal,
            on_timeout=spec.on_timeout,
            waiting_since=now,
            due_at=due,
        )
        .on_conflict_do_nothing()
    )
    record_event(
        session,
        row.job_id,
        "awaiting_signal",
        {"step_id": row.step_id, "signal": spec.signal, "due_at": due.isoformat()},
    )


@dataclass(frozen=True)
class Sent:
    job: JobRow
    signal: JobSignalRow
    resumed: list[str]
    """The steps the signal sent on, in the plan ``ready``."""
    ready: JobPlan


def send_signal(
    session: Session,
    job_id: uuid.UUID,
    name: str,
    payload: Any,
    *,
    by: str | None,
    visible_to: str | None,
    now: datetime,
) -> Sent:
    """Store a signal for a job and send on the steps parked for it.

    Refused when no step of the job's pipeline waits for ``name`` (``signal_not_awaited``),
    when the job already holds one of that name (``signal_already_received``) or when it is
    over (``job_conflict``). The job's row lock orders it against a second signal, a cancel, a
    deadline and the beat's timeouts."""
    job = session.scalars(select(JobRow).where(JobRow.id == job_id).with_for_update()).one_or_none()
    if job is None or (visible_to is not None and job.owner != visible_to):
        raise missing_job(session, job_id, owner=visible_to)
    profile = job_profile(job)
    waiters = [s.id for s in profile.steps if s.wait_for and s.wait_for.signal == name]
    if not waiters:
        raise SignalNotAwaited(
            f"no step of pipeline {job.pipeline!r} waits for signal {name!r}",
            {"signal": name, "pipeline": job.pipeline},
        )
    earlier = session.get(JobSignalRow, (job_id, name))
    if earlier is not None:
        raise SignalAlreadyReceived(
            f"job {job_id} already received signal {name!r} at {earlier.received_at.isoformat()}",
            {"signal": name, "received_at": earlier.received_at.isoformat()},
        )
    if job.status in JOB_FINAL:
        raise JobConflict(
            f"job {job_id} already {job.status}: nothing of it waits for a signal",
            {"job_id": str(job_id), "status": job.status},
        )
    stored = JobSignalRow(job_id=job_id, name=name, payload=payload, received_at=now, sent_by=by)
    session.add(stored)
    resumed = _resume(session, job_id, waiters)
    record_event(session, job_id, "signal_received", {"signal": name, "resumed": resumed})
    session.flush()
    return Sent(job, stored, resumed, steps_plan(profile, job_id, resumed).at(job.priority))


def _resume(session: Session, job_id: uuid.UUID, step_ids: list[str]) -> list[str]:
    rows = session.scalars(
        select(StepRunRow)
        .where(
            StepRunRow.job_id == job_id,
            StepRunRow.step_id.in_(step_ids),
            StepRunRow.shard == SHARD_NONE,
            StepRunRow.status == StepStatus.AWAITING_SIGNAL,
        )
        .with_for_update()
    ).all()
    for row in rows:
        row.status = StepStatus.PENDING
    return sorted(row.step_id for row in rows)


def resume_signalled(session: Session) -> list[JobPlan]:
    """Steps parked although their signal is stored (a park and a signal that crossed), sent
    on as the signal would have; plans to send after the commit."""
    found = session.execute(
        select(StepRunRow.job_id, StepRunRow.step_id)
        .join(
            SignalWaitRow,
            and_(
                SignalWaitRow.job_id == StepRunRow.job_id,
                SignalWaitRow.step_id == StepRunRow.step_id,
            ),
        )
        .join(
            JobSignalRow,
            and_(
                JobSignalRow.job_id == SignalWaitRow.job_id,
                JobSignalRow.name == SignalWaitRow.signal,
            ),
        )
        .where(StepRunRow.status == StepStatus.AWAITING_SIGNAL)
        .limit(EXPIRE_BATCH)
    ).all()
    by_job: dict[uuid.UUID, list[str]] = {}
    for job_id, step_id in found:
        by_job.setdefault(job_id, []).append(step_id)
    plans = []
    for job_id, step_ids in by_job.items():
        job = session.scalars(
            select(JobRow).where(JobRow.id == job_id).with_for_update(skip_locked=True)
        ).one_or_none()
        if job is None or job.status in JOB_FINAL:
            continue
        resumed = _resume(session, job_id, step_ids)
        plans.append(steps_plan(job_profile(job), job_id, resumed).at(job.priority))
    session.flush()
    return plans


def expire_waits(session: Session, now: datetime) -> list[JobPlan]:
    """Carry out the ``on_timeout`` of up to ``EXPIRE_BATCH`` waits past due, earliest first;
    what they make ready (the step itself, its children, or the compensations of a job it
    failed) is sent after the commit. A job locked by another transaction is skipped: the next
    tick finds its waits again."""
    waits = session.execute(
        select(SignalWaitRow, JobRow)
        .join(JobRow, JobRow.id == SignalWaitRow.job_id)
        .join(
            StepRunRow,
            and_(
                StepRunRow.job_id == SignalWaitRow.job_id,
                StepRunRow.step_id == SignalWaitRow.step_id,
                StepRunRow.shard == SHARD_NONE,
            ),
        )
        .where(
            SignalWaitRow.timed_out_at.is_(None),
            SignalWaitRow.due_at <= now,
            StepRunRow.status == StepStatus.AWAITING_SIGNAL,
        )
        .order_by(SignalWaitRow.due_at)
        .limit(EXPIRE_BATCH)
        .with_for_update(of=[JobRow, SignalWaitRow], skip_locked=True)
    ).all()
    plans = []
    for wait, job in waits:
        key = StepKey(job.id, wait.step_id)
        row = session.scalars(
            select(StepRunRow)
            .where(
                StepRunRow.job_id == key.job_id,
                StepRunRow.step_id == key.step_id,
                StepRunRow.shard == SHARD_NONE,
            )
            .with_for_update()
        ).one()
        wait.timed_out_at = now
        waited = round((now - wait.waiting_since).total_seconds())
        record_event(
            session,
            job.id,
            "signal_timed_out",
            {"step_id": wait.step_id, "signal": wait.signal, "on_timeout": wait.on_timeout},
        )
        if wait.on_timeout == "continue":
            row.status = StepStatus.PENDING
            plans.append(steps_plan(job_profile(job), job.id, [wait.step_id]).at(job.priority))
            continue
        error = {
            "code": SIGNAL_TIMEOUT,
            "message": f"no signal {wait.signal!r} arrived within {waited}s",
            "details": {"signal": wait.signal, "waited_s": waited},
        }
        plans.append(record_failure(session, row, key, error, None, now).ready.at(job.priority))
    session.flush()
    return plans


def next_signal_due(session: Session) -> datetime | None:
    """The earliest timeout of a step waiting for a signal, for the beat leader to wake up at."""
    return session.scalar(
        select(func.min(SignalWaitRow.due_at))
        .join(
            StepRunRow,
            and_(
                StepRunRow.job_id == SignalWaitRow.job_id,
                StepRunRow.step_id == SignalWaitRow.step_id,
            ),
        )
        .where(
            SignalWaitRow.timed_out_at.is_(None),
            StepRunRow.status == StepStatus.AWAITING_SIGNAL,
        )
    )


def carry_signals(
    session: Session, parent_id: uuid.UUID, job_id: uuid.UUID, profile: Profile, reused: set[str]
) -> None:
    """A rerun keeps what its reused steps waited for: the signals they received, and the waits
    that timed out and went on, so the steps it runs again read ``signals.<name>`` as the
    parent's did. A waiting step that runs again waits for a signal of its own."""
    waits = {s.id: s.wait_for.signal for s in profile.steps if s.wait_for and s.id in reused}
    if not waits:
        return
    session.execute(
        insert(JobSignalRow).from_select(
            ["job_id", "name", "payload", "received_at", "sent_by"],
            select(
                literal(job_id, UUID(as_uuid=True)),
                JobSignalRow.name,
                JobSignalRow.payload,
                JobSignalRow.received_at,
                JobSignalRow.sent_by,
            ).where(JobSignalRow.job_id == parent_id, JobSignalRow.name.in_(set(waits.values()))),
        )
    )
    session.execute(
        insert(SignalWaitRow).from_select(
            [
                "job_id",
                "step_id",
                "signal",
                "on_timeout",
                "waiting_since",
                "due_at",
                "timed_out_at",
            ],
            select(
                literal(job_id, UUID(as_uuid=True)),
                SignalWaitRow.step_id,
                SignalWaitRow.signal,
                SignalWaitRow.on_timeout,
                SignalWaitRow.waiting_since,
                SignalWaitRow.due_at,
                SignalWaitRow.timed_out_at,
            ).where(
                SignalWaitRow.job_id == parent_id,
                SignalWaitRow.step_id.in_(list(waits)),
                SignalWaitRow.timed_out_at.is_not(None),
            ),
        )
    )


def _stored(session: Session, job_id: uuid.UUID, name: str) -> bool:
    return session.get(JobSignalRow, (job_id, name)) is not None


def _waited_out(session: Session, job_id: uuid.UUID, step_id: str) -> bool:
    wait = session.get(SignalWaitRow, (job_id, step_id))
    return wait is not None and wait.timed_out_at is not None
