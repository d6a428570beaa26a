"""Durable waits: a ``wait`` step parks in PostgreSQL until its time, and the elected beat
replica wakes it, as it times out approvals.

A wait step is claimed like any other; in the claim's transaction (``service.engine.parking``)
its resolved ``seconds`` or ``until`` becomes a ``wake_at`` (``sleep``), and the step is
parked: ``sleeping``, with no lease, while its job stays ``running``. Its worker moves on at
once, so a wait holds no worker slot and no message, and a worker killed, a beat replica killed
or Redis flushed meanwhile loses nothing: only PostgreSQL knows the step waits. Each tick the
beat leader wakes the steps due (``wake_due``): their checkpoint says how long they waited,
their children are counted off as for any step that succeeds, and what that makes ready is sent
after the commit. The leader sleeps no later than the next ``wake_at`` (``next_wake``), and a
parked step notifies the schedules channel so that a sleeping leader recomputes that.
"""

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import and_, exists, func, select
from sqlalchemy.orm import Session

from service.catalogue.notices import record_event
from service.engine.checkpoints import write_checkpoint
from service.engine.completion import succeed_step, unresolvable
from service.engine.leases import due_rows
from service.engine.steps import StepKey, Unresolvable, Woke
from service.language.plan import JobPlan
from service.language.snapshots import job_profile
from service.language.waits import wake_time
from service.platform.constants import SCHEDULES_CHANNEL, WAKE_BATCH
from service.platform.errors import WaitInvalid
from service.platform.models import JobRow, StepRunRow
from service.platform.states import JOB_OPEN, StepStatus

_ASLEEP = and_(
    StepRunRow.status == StepStatus.SLEEPING,
    exists().where(JobRow.id == StepRunRow.job_id, JobRow.status.in_(list(JOB_OPEN))),
)
"""A sleeping step of an open job: a sleeper left behind by a job that ended some other way
than through ``close_open_steps`` would otherwise keep the leader ticking at once."""
TIMED_RETRY = and_(StepRunRow.status == StepStatus.RETRYING, StepRunRow.wake_at.is_not(None))
"""A step whose next attempt waits for its ``wake_at``: a ``pipeline.run`` step backing off
after a failed child (``service.engine.children``). Parked as a sleeper is: no message, and
the beat leader sends it when due, so neither the sweeper nor a job's plan sends it."""


def sleep(
    session: Session, job: JobRow, row: StepRunRow, inputs: Mapping[str, Any], now: datetime
) -> Woke | Unresolvable | None:
    """Park a held wait step until the time its resolved inputs say, counted from its claim; a
    time that is not one fails it for good, as inputs that do not resolve do."""
    key = StepKey(row.job_id, row.step_id)
    try:
        wake_at = wake_time(inputs, row.started_at or now)
    except WaitInvalid as exc:
        return unresolvable(session, row, key, exc, now)
    return _park(session, job, row, wake_at, now)


def _park(
    session: Session, job: JobRow, row: StepRunRow, wake_at: datetime, now: datetime
) -> Woke | None:
    """One whose time has passed already succeeds now, in this transaction, and ``Woke``
    carries what it made ready."""
    if wake_at <= now:
        return Woke(StepKey(row.job_id, row.step_id), _wake(session, job, row, now))
    row.status = StepStatus.SLEEPING
    row.wake_at = wake_at
    row.lease_token = None
    row.lease_until = None
    record_event(
        session, row.job_id, "sleeping", {"step_id": row.step_id, "wake_at": wake_at.isoformat()}
    )
    session.execute(select(func.pg_notify(SCHEDULES_CHANNEL, "wait")))
    return None


def wake_due(session: Session, now: datetime) -> list[JobPlan]:
    """Wake up to ``WAKE_BATCH`` sleeping steps whose time has come; the plans to send once
    the caller has committed.

    Each job row is locked before its step row, the order a cancellation takes them in, so a
    wake and a cancel of the same job wait for each other instead of deadlocking; a step that
    a cancel settled meanwhile is found no longer sleeping and left alone."""
    asleep = StepRunRow.status == StepStatus.SLEEPING
    return [
        _wake(session, job, row, now).at(job.priority)
        for job, row in due_rows(session, _ASLEEP, asleep, now, WAKE_BATCH)
    ]


def next_wake(session: Session) -> datetime | None:
    """The earliest ``wake_at`` of any sleeping step, for the beat leader's sleep."""
    value: datetime | None = session.scalar(select(func.min(StepRunRow.wake_at)).where(_ASLEEP))
    return value


def _wake(session: Session, job: JobRow, row: StepRunRow, now: datetime) -> JobPlan:
    """Checkpoint the wait and succeed it: its children read when it began and woke."""
    began = row.started_at or now
    output: dict[str, Any] = {
        "waited_s": round(max(0.0, (now - began).total_seconds()), 3),
        "began_at": began.isoformat(),
        "woke_at": now.isoformat(),
    }
    write_checkpoint(session, StepKey(row.job_id, row.step_id), output)
    return succeed_step(session, row, job_profile(job), now)
