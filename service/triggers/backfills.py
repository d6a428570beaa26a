"""Backfills: a cron schedule's fire times over a past range, each run once, paced.

A backfill is stored whole when it is made (range, pacing, the schedule's timing) and started
by the elected scheduler (``top_up``): oldest fire first, never more than ``max_active`` of its
jobs open at once. Each fire is taken through the same ``schedule_fires`` fence as the
schedule's own fires, in the transaction that moves the backfill's ``cursor``, so a leader
killed halfway leaves the next one a cursor and fences to go on from: no fire skipped, none
run twice. A fire that has run already, by the schedule or by another backfill, is counted as
skipped and not started again; one the schedule recorded without a job (skipped by its overlap
policy, or refused) is run.

Functions flush; the caller commits, then publishes the jobs ``top_up`` returns.
"""

import uuid
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session
from sqlalchemy.sql.dml import ReturningInsert

from service.engine.compensations import unfinished as unfinished_compensations
from service.engine.jobs import cancel_job
from service.engine.submission import submit_job
from service.language.cron import Timing, next_fire
from service.platform.audit import Actor, Target, record
from service.platform.constants import SCHEDULES_CHANNEL
from service.platform.errors import (
    BackfillConflict,
    BackfillInvalid,
    BackfillNotCron,
    BackfillNotFound,
    BackfillTooLarge,
    FlowbeatError,
    JobConflict,
)
from service.platform.models import BackfillRow, JobRow, ScheduleFireRow, ScheduleRow
from service.platform.settings import Settings
from service.triggers.firing import fire_request
from service.triggers.schedules import OPEN_STATUSES, find_schedule

RUNNING = "running"
COMPLETED = "completed"
CANCELLED = "cancelled"

BACKFILL_LIST_MAX = 100
"""The newest backfills a list shows."""

_TAKEN = "created"
"""The outcome of a fire record that made a job: such a fire has run and is never run again."""


@dataclass(frozen=True)
class BackfillRange:
    start: datetime
    """Inclusive: a fire at ``start`` is in the range."""
    end: datetime
    """Exclusive, so two ranges that meet share no fire."""
    max_active: int = 1


@dataclass
class BackfillProgress:
    backfill: BackfillRow
    jobs: dict[str, int] = field(default_factory=dict)
    """Started jobs by status; ``error`` counts fires whose job could not be made."""

    @property
    def started(self) -> int:
        return sum(self.jobs.values())

    @property
    def pending(self) -> int:
        return max(0, self.backfill.total - self.backfill.skipped - self.started)

    @property
    def open(self) -> int:
        return sum(n for status, n in self.jobs.items() if status in OPEN_STATUSES)


@dataclass
class TopUp:
    """The jobs a committed top-up leaves for the caller to send."""

    jobs: list[JobRow] = field(default_factory=list)


@dataclass
class Ended:
    """What a committed cancel leaves for the caller to send: revokes of the running tasks of
    the jobs it cancelled, and the compensations of the sagas among them."""

    cancelled: list[uuid.UUID] = field(default_factory=list)
    revoke: list[str] = field(default_factory=list)
    compensate: list[uuid.UUID] = field(default_factory=list)


def timing_of(row: BackfillRow) -> Timing:
    return Timing(cron=row.cron, every_s=None, timezone=row.timezone)


def fires_in(timing: Timing, span: BackfillRange, limit: int) -> list[datetime]:
    """The fire times in ``[start, end)``, oldest first; refused past ``limit`` of them."""
    fires: list[datetime] = []
    current = next_fire(timing, span.start - timedelta(microseconds=1))
    while current < span.end:
        if len(fires) == limit:
            raise BackfillTooLarge(
                f"the range holds more than {limit} fire times; backfill it in parts",
                {"limit": limit},
            )
        fires.append(current)
        current = next_fire(timing, current)
    return fires


def _checked(schedule: ScheduleRow, span: BackfillRange, settings: Settings, now: datetime) -> int:
    """The number of fires a backfill would cover, or why there is to be no backfill."""
    if schedule.cron is None:
        raise BackfillNotCron(
            "only a cron schedule can be backfilled", {"schedule_id": str(schedule.id)}
        )
    details = {"from": span.start.isoformat(), "to": span.end.isoformat()}
    if span.max_active < 1:
        raise BackfillInvalid("max_active must be at least 1", {"max_active": span.max_active})
    if span.start >= span.end:
        raise BackfillInvalid("'from' must be before 'to'", details)
    if span.end > now:
        raise BackfillInvalid("'to' must not be in the future: those fires are not due", details)
    timing = Timing(cron=schedule.cron, every_s=None, timezone=schedule.timezone)
    total = len(fires_in(timing, span, settings.backfill_max_fires))
    if total == 0:
        raise BackfillInvalid("the schedule has no fire time in the range", details)
    return total


def create_backfill(
    session: Session,
    *,
    owner: str,
    pipeline: str,
    schedule: str | None,
    span: BackfillRange,
    settings: Settings,
    actor: Actor,
    now: datetime,
) -> BackfillRow:
    """Store a backfill to be started by the scheduler leader, which its commit wakes, and
    audit it as ``actor``'s."""
    row = find_schedule(session, owner=owner, pipeline=pipeline, schedule=schedule)
    total = _checked(row, span, settings, now)
    assert row.cron is not None
    backfill = BackfillRow(
        id=uuid.uuid4(),
        schedule_id=row.id,
        owner=owner,
        pipeline=pipeline,
        range_from=span.start,
        range_to=span.end,
        cron=row.cron,
        timezone=row.timezone,
        max_active=span.max_active,
        total=total,
        skipped=0,
        status=RUNNING,
        created_by=actor.actor,
        created_at=now,
    )
    session.add(backfill)
    session.flush()
    session.execute(select(func.pg_notify(SCHEDULES_CHANNEL, str(backfill.id))))
    detail = {
        "pipeline": pipeline,
        "schedule_id": str(backfill.schedule_id),
        "from": backfill.range_from.isoformat(),
        "to": backfill.range_to.isoformat(),
        "max_active": backfill.max_active,
        "total": backfill.total,
    }
    record(session, actor, "backfill.create", Target("backfill", str(backfill.id)), detail, at=now)
    return backfill


def running_ids(session: Session) -> list[uuid.UUID]:
    return list(
        session.scalars(
            select(BackfillRow.id).where(BackfillRow.status == RUNNING).order_by(BackfillRow.id)
        )
    )


def _open_jobs(session: Session, backfill_id: uuid.UUID) -> list[uuid.UUID]:
    return list(
        session.scalars(
            select(JobRow.id)
            .join(ScheduleFireRow, ScheduleFireRow.job_id == JobRow.id)
            .where(ScheduleFireRow.backfill_id == backfill_id, JobRow.status.in_(OPEN_STATUSES))
        )
    )


def _has_run(session: Session, schedule_id: uuid.UUID, fire: datetime) -> bool:
    """A fire with a job, by its record or, once its record is pruned, by the job itself."""
    recorded = select(ScheduleFireRow.id).where(
        ScheduleFireRow.schedule_id == schedule_id,
        ScheduleFireRow.fire_at == fire,
        ScheduleFireRow.outcome == _TAKEN,
    )
    started = select(JobRow.id).where(
        JobRow.schedule_id == schedule_id, JobRow.scheduled_for == fire
    )
    return bool(session.scalar(select(recorded.exists() | started.exists())))


class _Taken(Exception):
    """Another scheduler fenced the fire between the look and the insert."""


def _fence(
    backfill: BackfillRow, fire: datetime, job_id: uuid.UUID | None, outcome: str
) -> ReturningInsert[tuple[int]]:
    """The fire's record, or the record of a fire that made no job taken over; nothing
    (no row returned) when the fire has a job already."""
    statement = insert(ScheduleFireRow).values(
        schedule_id=backfill.schedule_id,
        fire_at=fire,
        job_id=job_id,
        outcome=outcome,
        backfill_id=backfill.id,
    )
    return statement.on_conflict_do_update(
        index_elements=[ScheduleFireRow.schedule_id, ScheduleFireRow.fire_at],
        set_={"job_id": job_id, "outcome": outcome, "backfill_id": backfill.id},
        where=ScheduleFireRow.outcome != _TAKEN,
    ).returning(ScheduleFireRow.id)


def _take(
    session: Session,
    backfill: BackfillRow,
    schedule: ScheduleRow,
    fire: datetime,
    *,
    profiles_dir: Path | None,
    known_actions: Collection[str],
) -> JobRow | None:
    """Start the job of one fire with its fence, or count the fire as skipped when it has run."""
    if _has_run(session, schedule.id, fire):
        backfill.skipped += 1
        return None
    try:
        with session.begin_nested():
            job, _ = submit_job(
                session,
                fire_request(schedule, fire),
                owner=schedule.owner,
                profiles_dir=profiles_dir,
                known_actions=known_actions,
            )
            if session.scalar(_fence(backfill, fire, job.id, _TAKEN)) is None:
                raise _Taken
    except _Taken:
        backfill.skipped += 1
        return None
    except FlowbeatError:
        session.execute(_fence(backfill, fire, None, "error"))
        return None
    return job


def top_up(
    session: Session,
    backfill_id: uuid.UUID,
    *,
    profiles_dir: Path | None,
    known_actions: Collection[str],
    now: datetime,
) -> TopUp:
    """Start the backfill's next fires while fewer than ``max_active`` of its jobs are open;
    completed once every fire is handed out and none of its jobs is open. A backfill another
    transaction holds is left for the next tick."""
    result = TopUp()
    backfill = session.scalars(
        select(BackfillRow)
        .where(BackfillRow.id == backfill_id, BackfillRow.status == RUNNING)
        .with_for_update(skip_locked=True)
    ).one_or_none()
    if backfill is None:
        return result
    schedule = session.get_one(ScheduleRow, backfill.schedule_id)
    timing = timing_of(backfill)
    open_now = len(_open_jobs(session, backfill.id))
    after = backfill.cursor or backfill.range_from - timedelta(microseconds=1)
    fire = next_fire(timing, after)
    while fire < backfill.range_to and open_now < backfill.max_active:
        job = _take(
            session,
            backfill,
            schedule,
            fire,
            profiles_dir=profiles_dir,
            known_actions=known_actions,
        )
        backfill.cursor = fire
        if job is not None:
            result.jobs.append(job)
            open_now += 1
        fire = next_fire(timing, fire)
    if fire >= backfill.range_to and open_now == 0:
        backfill.status = COMPLETED
        backfill.finished_at = now
    session.flush()
    return result


def find_backfill(
    session: Session,
    *,
    owner: str,
    pipeline: str,
    schedule: str | None,
    backfill_id: uuid.UUID,
    for_update: bool = False,
) -> BackfillRow:
    """The owner's backfill ``backfill_id`` of ``pipeline``, of the schedule ``schedule`` (an
    id or a name) when given, else of whichever of its schedules: an id names one already."""
    query = select(BackfillRow).where(
        BackfillRow.id == backfill_id,
        BackfillRow.owner == owner,
        BackfillRow.pipeline == pipeline,
    )
    if schedule is not None:
        row = find_schedule(session, owner=owner, pipeline=pipeline, schedule=schedule)
        query = query.where(BackfillRow.schedule_id == row.id)
    if for_update:
        query = query.with_for_update()
    backfill = session.scalars(query).one_or_none()
    if backfill is None:
        raise BackfillNotFound(
            f"pipeline {pipeline!r} has no backfill {backfill_id}",
            {"pipeline": pipeline, "schedule": schedule, "backfill_id": str(backfill_id)},
        )
    return backfill


def cancel_backfill(
    session: Session,
    *,
    owner: str,
    pipeline: str,
    schedule: str | None,
    backfill_id: uuid.UUID,
    actor: Actor,
    now: datetime,
) -> tuple[BackfillRow, Ended]:
    """Start no more of its fires and cancel its open jobs, audited as ``actor``'s; the jobs'
    running tasks and compensations are the caller's to send after the commit. Cancelling a
    cancelled backfill changes nothing; a completed one is refused."""
    backfill = find_backfill(
        session,
        owner=owner,
        pipeline=pipeline,
        schedule=schedule,
        backfill_id=backfill_id,
        for_update=True,
    )
    result = Ended()
    if backfill.status == CANCELLED:
        return backfill, result
    if backfill.status == COMPLETED:
        raise BackfillConflict(
            f"backfill {backfill_id} already completed", {"backfill_id": str(backfill_id)}
        )
    backfill.status = CANCELLED
    backfill.finished_at = now
    for job_id in _open_jobs(session, backfill.id):
        try:
            job, running = cancel_job(session, job_id, owner=None, now=now)
        except JobConflict:
            continue
        result.cancelled.append(job.id)
        result.revoke.extend(running)
        if unfinished_compensations(session, job.id):
            result.compensate.append(job.id)
    session.flush()
    detail = {"pipeline": pipeline, "cancelled_jobs": len(result.cancelled)}
    record(session, actor, "backfill.cancel", Target("backfill", str(backfill.id)), detail, at=now)
    return backfill, result


def progress(session: Session, rows: Collection[BackfillRow]) -> list[BackfillProgress]:
    """Each backfill with its started jobs counted by status, in one statement."""
    counts = session.execute(
        select(
            ScheduleFireRow.backfill_id,
            func.coalesce(JobRow.status, ScheduleFireRow.outcome),
            func.count(),
        )
        .outerjoin(JobRow, JobRow.id == ScheduleFireRow.job_id)
        .where(ScheduleFireRow.backfill_id.in_([row.id for row in rows]))
        .group_by(
            ScheduleFireRow.backfill_id, func.coalesce(JobRow.status, ScheduleFireRow.outcome)
        )
    )
    by_id = {row.id: BackfillProgress(row) for row in rows}
    for backfill_id, status, count in counts:
        if backfill_id is not None:
            by_id[backfill_id].jobs[status] = count
    return [by_id[row.id] for row in rows]


def list_backfills(
    session: Session, *, owner: str, pipeline: str, schedule: str | None
) -> list[BackfillProgress]:
    """A schedule's backfills, newest first."""
    row = find_schedule(session, owner=owner, pipeline=pipeline, schedule=schedule)
    rows = session.scalars(
        select(BackfillRow)
        .where(BackfillRow.schedule_id == row.id)
        .order_by(BackfillRow.created_at.desc(), BackfillRow.id)
        .limit(BACKFILL_LIST_MAX)
    ).all()
    return progress(session, rows)


def pipeline_backfills(session: Session, *, owner: str, pipeline: str) -> list[BackfillProgress]:
    """The backfills of all a pipeline's schedules, newest first."""
    rows = session.scalars(
        select(BackfillRow)
        .where(BackfillRow.owner == owner, BackfillRow.pipeline == pipeline)
        .order_by(BackfillRow.created_at.desc(), BackfillRow.id)
        .limit(BACKFILL_LIST_MAX)
    ).all()
    return progress(session, rows)


@dataclass(frozen=True)
class BackfillFire:
    fire_at: datetime
    job_id: uuid.UUID | None
    status: str


def fires_of(session: Session, backfill_id: uuid.UUID) -> list[BackfillFire]:
    """The fires a backfill started, oldest first, with their jobs' statuses."""
    rows = session.execute(
        select(
            ScheduleFireRow.fire_at, ScheduleFireRow.job_id, JobRow.status, ScheduleFireRow.outcome
        )
        .outerjoin(JobRow, JobRow.id == ScheduleFireRow.job_id)
        .where(ScheduleFireRow.backfill_id == backfill_id)
        .order_by(ScheduleFireRow.fire_at)
    )
    return [
        BackfillFire(fire_at, job_id, status or outcome)
        for fire_at, job_id, status, outcome in rows
    ]
