"""Sagas: undoing the steps of a job that failed for good or was cancelled.

The transaction that ends the job records one compensation per succeeded step that has a
``compensate`` action, latest completion first (``seq``). They run one at a time in that order:
a claim takes only the first unfinished one, under a lease, so a redelivered message or one the
sweeper re-sent cannot run two at once or run them out of order. Each has its own retry policy;
one that fails for good is ``compensation_failed`` and the next one still runs. The action gets
a stable idempotency key (job, step, "compensate"), since a worker killed mid-compensation
means it runs again; its outcome is recorded once, by the holder of the lease.

A message names the compensation it is for, because its time limits are that compensation's
``timeout_s`` and Celery fixes them when the message is sent. Whoever cannot know which one is
next (the transaction that ends the job, the sweeper) sends an unnamed message, and the worker
that takes it sends the named one in its place.
"""

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, exists, func, or_, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session, aliased

from service.engine.checkpoints import step_outputs
from service.engine.leases import take_compensation
from service.language.expressions import ExprContext, parse_refs, resolve
from service.language.profiles import Profile
from service.language.specs import CompensateSpec
from service.platform.constants import DEFAULT_QUEUE, SHARD_NONE, WAIT_FOR_PEER_MAX_S
from service.platform.errors import ExpressionError
from service.platform.models import CompensationRow, JobRow, StepRunRow
from service.platform.states import COMPENSATION_FINAL, CompensationStatus, StepStatus


def idempotency_key(job_id: uuid.UUID, step_id: str) -> str:
    return f"{job_id}:{step_id}:compensate"


def record_compensations(session: Session, job: JobRow, profile: Profile, now: datetime) -> bool:
    """In the transaction that ends ``job``: what to undo, latest completion first. Steps
    reused by a rerun did their work in another job, which compensates them itself."""
    undoable = [step.id for step in profile.steps if step.compensate is not None]
    if not undoable:
        return False
    done = session.scalars(
        select(StepRunRow.step_id)
        .where(
            StepRunRow.job_id == job.id,
            StepRunRow.shard == SHARD_NONE,
            StepRunRow.status == StepStatus.SUCCEEDED,
            StepRunRow.step_id.in_(undoable),
        )
        .order_by(StepRunRow.finished_at.desc(), StepRunRow.id.desc())
    ).all()
    if not done:
        return False
    session.execute(
        insert(CompensationRow)
        .values(
            [
                {
                    "job_id": job.id,
                    "step_id": step_id,
                    "seq": seq,
                    "status": CompensationStatus.PENDING,
                    "attempts": 0,
                    "due_at": now,
                }
                for seq, step_id in enumerate(done)
            ]
        )
        .on_conflict_do_nothing()
    )
    return True


@dataclass(frozen=True)
class CompensationClaim:
    job_id: uuid.UUID
    step_id: str
    token: str
    attempt: int
    spec: CompensateSpec
    inputs: dict[str, Any]
    params: dict[str, Any]


@dataclass(frozen=True)
class Due:
    """The compensation to run next: the message for it carries its ``timeout_s``."""

    step_id: str
    timeout_s: int
    queue: str = DEFAULT_QUEUE
    """The queue of the step it undoes: the pool whose workers can run that step's actions."""


@dataclass(frozen=True)
class Busy:
    """The next compensation is held by a live lease: ask again once it could have lapsed,
    since its holder may have been killed and this message is then the one to take over."""

    retry_in_s: float


def claim_next(
    session: Session,
    job: JobRow,
    profile: Profile,
    step_id: str | None,
    lease_s: float,
    now: datetime,
) -> CompensationClaim | Due | Busy | None:
    """The first unfinished compensation of the job, taken under a lease when it is the one
    ``step_id`` names; ``Due`` when the message is for another one or none; ``None`` when all
    are finished."""
    while True:
        row = session.scalars(
            select(CompensationRow)
            .where(
                CompensationRow.job_id == job.id,
                CompensationRow.status.not_in(list(COMPENSATION_FINAL)),
            )
            .order_by(CompensationRow.seq)
            .limit(1)
            .with_for_update()
        ).one_or_none()
        if row is None:
            return None
        if row.lease_until is not None and row.lease_until > now:
            remaining = (row.lease_until - now).total_seconds()
            return Busy(min(max(remaining, 0.2), WAIT_FOR_PEER_MAX_S))
        spec = profile.step(row.step_id).compensate
        assert spec is not None
        if row.step_id != step_id:
            return Due(row.step_id, spec.timeout_s, profile.queue_of(row.step_id))
        try:
            inputs = _inputs(session, job, row.step_id, spec)
        except ExpressionError as exc:
            error = {"code": exc.code, "message": exc.message, "details": exc.details}
            _finish(session, row, CompensationStatus.FAILED, error, now)
            continue
        take_compensation(row, lease_s, now)
        assert row.lease_token is not None
        return CompensationClaim(
            job.id, row.step_id, row.lease_token, row.attempts, spec, inputs, dict(job.params)
        )


def _inputs(session: Session, job: JobRow, step_id: str, spec: CompensateSpec) -> dict[str, Any]:
    steps = {ref.name for ref in parse_refs(spec.with_) if ref.root == "steps" and ref.name}
    outputs = step_outputs(session, job.id, steps)
    context = ExprContext(params=job.params, outputs=outputs, trigger=job.trigger_data or {})
    resolved: dict[str, Any] = resolve(spec.with_, context)
    return resolved


def record_outcome(
    session: Session,
    claim: CompensationClaim,
    error: dict[str, Any] | None,
    retry_delay_s: float | None,
    now: datetime,
) -> None:
    """Done, to be retried after ``retry_delay_s``, or failed for good; only by the holder."""
    row = session.scalars(
        select(CompensationRow)
        .where(CompensationRow.job_id == claim.job_id, CompensationRow.step_id == claim.step_id)
        .with_for_update()
    ).one()
    if row.lease_token != claim.token or row.status != CompensationStatus.RUNNING:
        return
    if error is None:
        _finish(session, row, CompensationStatus.COMPENSATED, None, now)
    elif retry_delay_s is not None:
        row.status = CompensationStatus.PENDING
        row.error = error
        row.lease_token = None
        row.lease_until = now + timedelta(seconds=retry_delay_s)
        row.due_at = now + timedelta(seconds=retry_delay_s)
    else:
        _finish(session, row, CompensationStatus.FAILED, error, now)


def _finish(
    session: Session,
    row: CompensationRow,
    status: CompensationStatus,
    error: dict[str, Any] | None,
    now: datetime,
) -> None:
    """Record the outcome; the ones after it become due now, so that the sweeper gives the
    message for the next one its grace from this moment rather than from the job's end."""
    row.status = status
    row.error = error
    row.finished_at = now
    row.lease_token = None
    row.lease_until = None
    session.execute(
        update(CompensationRow)
        .where(
            CompensationRow.job_id == row.job_id,
            CompensationRow.seq > row.seq,
            CompensationRow.status == CompensationStatus.PENDING,
        )
        .values(due_at=now)
    )


def next_due(session: Session, job_id: uuid.UUID, profile: Profile) -> Due | None:
    """The compensation to send a message for once the one before it is recorded."""
    step_id = session.scalar(
        select(CompensationRow.step_id)
        .where(
            CompensationRow.job_id == job_id,
            CompensationRow.status.not_in(list(COMPENSATION_FINAL)),
        )
        .order_by(CompensationRow.seq)
        .limit(1)
    )
    if step_id is None:
        return None
    spec = profile.step(step_id).compensate
    assert spec is not None
    return Due(step_id, spec.timeout_s, profile.queue_of(step_id))


def unfinished(session: Session, job_id: uuid.UUID) -> bool:
    """Whether a job has compensations left to run, so that whoever ended it sends them."""
    return bool(
        session.scalar(
            select(func.count())
            .select_from(CompensationRow)
            .where(
                CompensationRow.job_id == job_id,
                CompensationRow.status.not_in(list(COMPENSATION_FINAL)),
            )
        )
    )


def lost(session: Session, now: datetime, sent_before: datetime) -> set[uuid.UUID]:
    """Jobs whose next compensation nobody is running: pending since before ``sent_before``,
    or running under a lapsed lease. Only the first unfinished one of a job counts, since the
    ones after it wait for it, not for a message.

    A job sent again at or after ``sent_before`` (the grace a message needs, or the oldest
    message still queued when that is older) is left to that message: behind a backlog, sending
    every pass would add a message per waiting compensation at each pass, and the backlog
    would feed itself."""
    earlier = aliased(CompensationRow)
    not_resent = or_(JobRow.dispatched_at.is_(None), JobRow.dispatched_at < sent_before)
    return set(
        session.scalars(
            select(CompensationRow.job_id)
            .join(JobRow, JobRow.id == CompensationRow.job_id)
            .where(
                or_(
                    and_(
                        CompensationRow.status == CompensationStatus.PENDING,
                        CompensationRow.due_at < sent_before,
                        not_resent,
                    ),
                    and_(
                        CompensationRow.status == CompensationStatus.RUNNING,
                        CompensationRow.lease_until < now,
                        or_(not_resent, JobRow.dispatched_at <= CompensationRow.lease_until),
                    ),
                ),
                ~exists().where(
                    earlier.job_id == CompensationRow.job_id,
                    earlier.seq < CompensationRow.seq,
                    earlier.status.not_in(list(COMPENSATION_FINAL)),
                ),
            )
        )
    )


def compensation_of(session: Session, job_id: uuid.UUID) -> dict[str, Any] | None:
    """What the API shows: the saga's overall status and each compensation's outcome."""
    rows = session.scalars(
        select(CompensationRow)
        .where(CompensationRow.job_id == job_id)
        .order_by(CompensationRow.seq)
    ).all()
    if not rows:
        return None
    statuses = {row.status for row in rows}
    if statuses - COMPENSATION_FINAL:
        overall = "running"
    elif CompensationStatus.FAILED in statuses:
        overall = "failed"
    else:
        overall = "completed"
    return {
        "status": overall,
        "steps": [
            {
                "step_id": row.step_id,
                "status": row.status,
                "attempts": row.attempts,
                "error": row.error,
            }
            for row in rows
        ],
    }


def failed_compensation_jobs() -> Any:
    """A filter of jobs with a compensation that failed for good, for operators' listings."""
    return JobRow.id.in_(
        select(CompensationRow.job_id).where(CompensationRow.status == CompensationStatus.FAILED)
    )
