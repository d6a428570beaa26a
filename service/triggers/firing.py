"""The elected scheduler's tick: which schedules are due, firing each once, and cancelling
scheduled runs past their timeout.

Functions flush; the caller commits and only then publishes the jobs a tick created. Each due
schedule is fired in its own transaction that holds the schedule row, creates the job through
``submit_job`` and inserts the ``schedule_fires`` row. The unique (schedule, fire time) on that
row is the fence: a scheduler that lost its lock without noticing can only fail to insert.
"""

import logging
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import cast

from sqlalchemy import func, insert, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.engine.compensations import unfinished as unfinished_compensations
from service.engine.jobs import cancel_job
from service.engine.submission import JobRequest, Outcome, submit_job
from service.language.cron import (
    Catchup,
    due_fires,
    fires_between,
    jitter_s,
    next_fire,
)
from service.platform.constants import TRIGGER_SCHEDULE
from service.platform.errors import DuplicateJob, FlowbeatError
from service.platform.models import JobRow, ScheduleFireRow, ScheduleRow
from service.triggers.schedules import OPEN_STATUSES, timing_of

log = logging.getLogger(__name__)


@dataclass
class TickResult:
    """What a committed tick leaves for the caller to send: new jobs and tasks to revoke."""

    jobs: list[JobRow] = field(default_factory=list)
    revoke: list[str] = field(default_factory=list)
    compensate: list[uuid.UUID] = field(default_factory=list)
    """Cancelled jobs with compensations to run (sagas whose profile says ``on_cancel:
    compensate``)."""
    fired: list[datetime] = field(default_factory=list)
    held_until: datetime | None = None


def due_schedule_ids(session: Session, now: datetime) -> list[uuid.UUID]:
    return list(
        session.scalars(
            select(ScheduleRow.id).where(
                ScheduleRow.enabled,
                or_(ScheduleRow.next_fire_at <= now, ScheduleRow.buffered_fire_at.is_not(None)),
            )
        )
    )


def next_wakeup(session: Session, *, held: Collection[uuid.UUID] = ()) -> datetime | None:
    """The earliest next fire of any enabled schedule but those ``held`` back by jitter (their
    next fire time has passed already), for the scheduler's sleep."""
    query = select(func.min(ScheduleRow.next_fire_at)).where(ScheduleRow.enabled)
    if held:
        query = query.where(ScheduleRow.id.not_in(held))
    value: datetime | None = session.scalar(query)
    return value


def _job_open(session: Session, job_id: uuid.UUID | None) -> bool:
    if job_id is None:
        return False
    status = session.scalar(select(JobRow.status).where(JobRow.id == job_id))
    return status in OPEN_STATUSES


def _record(session: Session, row: ScheduleRow, fire: datetime, outcome: str) -> bool:
    """Insert a fire record; False when another scheduler already recorded this fire."""
    try:
        with session.begin_nested():
            session.execute(
                insert(ScheduleFireRow).values(schedule_id=row.id, fire_at=fire, outcome=outcome)
            )
    except IntegrityError:
        return False
    return True


def fire_request(row: ScheduleRow, fire: datetime) -> JobRequest:
    """The job of one fire of a schedule, whether the schedule fired it or a backfill did: the
    fire time is the job's ``scheduled_for``, which its steps read as ``schedule.fire_time``."""
    return JobRequest(
        pipeline=row.pipeline,
        params=row.params,
        trigger=TRIGGER_SCHEDULE,
        schedule_id=row.id,
        scheduled_for=fire,
        diff_mode=row.diff_mode,
        notify_url=row.notify_url,
        timeout_s=row.timeout_s,
        priority=row.priority,
        labels=row.labels,
    )


def _start(
    session: Session,
    row: ScheduleRow,
    fire: datetime,
    *,
    profiles_dir: Path | None,
    known_actions: Collection[str],
) -> JobRow | None:
    """Create the job for one fire together with its fence row, or nothing at all. A fire
    whose job would duplicate an open or recent one (its pipeline's dedupe window) records that
    job as ``deduplicated`` and starts nothing; under ``reject`` it records ``duplicate``."""
    request = fire_request(row, fire)
    try:
        with session.begin_nested():
            job, outcome = submit_job(
                session,
                request,
                owner=row.owner,
                profiles_dir=profiles_dir,
                known_actions=known_actions,
            )
            created = outcome is Outcome.NEW
            session.execute(
                insert(ScheduleFireRow).values(
                    schedule_id=row.id,
                    fire_at=fire,
                    job_id=job.id,
                    outcome="created" if created else str(outcome),
                )
            )
    except IntegrityError:
        log.info("fire %s of schedule %s was already taken", fire, row.id)
        return None
    except FlowbeatError as exc:
        log.warning("schedule %s could not start %s: %s", row.id, row.pipeline, exc.message)
        _record(session, row, fire, "duplicate" if isinstance(exc, DuplicateJob) else "error")
        return None
    if not created:
        log.info("fire %s of schedule %s duplicates job %s", fire, row.id, job.id)
        return None
    row.last_job_id = job.id
    row.run_count += 1
    return job


def _run_fire(
    session: Session,
    row: ScheduleRow,
    fire: datetime,
    result: TickResult,
    *,
    profiles_dir: Path | None,
    known_actions: Collection[str],
    now: datetime,
) -> None:
    if _job_open(session, row.last_job_id):
        if row.overlap == "skip":
            _record(session, row, fire, "skipped")
            return
        if row.overlap == "buffer_one":
            if row.buffered_fire_at is None:
                row.buffered_fire_at = fire
            else:
                _record(session, row, fire, "skipped")
            return
        if row.overlap == "cancel_previous" and row.last_job_id is not None:
            _cancel(session, row.last_job_id, result, now)
    job = _start(session, row, fire, profiles_dir=profiles_dir, known_actions=known_actions)
    row.last_fire_at = fire
    if job is not None:
        result.jobs.append(job)
        result.fired.append(fire)


def fire_schedule(
    session: Session,
    schedule_id: uuid.UUID,
    *,
    now: datetime,
    grace_s: float,
    profiles_dir: Path | None,
    known_actions: Collection[str],
) -> TickResult:
    """Run whatever of one schedule is due at ``now`` and advance its next fire time.

    A schedule row another transaction holds is left for the next tick rather than waited on.
    """
    result = TickResult()
    row = session.scalars(
        select(ScheduleRow)
        .where(ScheduleRow.id == schedule_id, ScheduleRow.enabled)
        .with_for_update(skip_locked=True)
    ).one_or_none()
    if row is None:
        return result
    if row.buffered_fire_at is not None and not _job_open(session, row.last_job_id):
        buffered, row.buffered_fire_at = row.buffered_fire_at, None
        _run_fire(
            session,
            row,
            buffered,
            result,
            profiles_dir=profiles_dir,
            known_actions=known_actions,
            now=now,
        )
    if row.next_fire_at is None or row.next_fire_at > now:
        session.flush()
        return result
    timing = timing_of(row)
    fires = [row.next_fire_at, *fires_between(timing, row.next_fire_at, now)]
    newest = fires[-1]
    release_at = newest + timedelta(seconds=jitter_s(str(row.id), newest, row.jitter_s))
    waiting = now < release_at
    if waiting:
        result.held_until = release_at
    considered = fires[:-1] if waiting else fires
    for fire in due_fires(
        considered,
        now,
        catchup=cast(Catchup, row.catchup),
        window_s=row.catchup_window_s,
        grace_s=grace_s,
    ):
        _run_fire(
            session,
            row,
            fire,
            result,
            profiles_dir=profiles_dir,
            known_actions=known_actions,
            now=now,
        )
    row.next_fire_at = newest if waiting else next_fire(timing, newest)
    session.flush()
    return result


def cancel_overdue(session: Session, *, now: datetime, timeout_s: float) -> TickResult:
    """Cancel scheduled jobs still open ``timeout_s`` after they started (or were queued)."""
    result = TickResult()
    cutoff = now - timedelta(seconds=timeout_s)
    overdue = session.scalars(
        select(JobRow.id)
        .where(
            JobRow.schedule_id.is_not(None),
            JobRow.status.in_(OPEN_STATUSES),
            func.coalesce(JobRow.started_at, JobRow.created_at) < cutoff,
        )
        .limit(100)
        .with_for_update(skip_locked=True)
    ).all()
    for job_id in overdue:
        job = _cancel(session, job_id, result, now)
        job.error = {
            "code": "run_timeout",
            "message": f"scheduled run exceeded {timeout_s:.0f}s",
            "details": {"timeout_s": timeout_s},
        }
    session.flush()
    return result


def _cancel(session: Session, job_id: uuid.UUID, result: TickResult, now: datetime) -> JobRow:
    """A cancellation by the scheduler is a cancellation: a saga compensates as it would on a
    person's request, once the tick has committed."""
    job, running = cancel_job(session, job_id, owner=None, now=now)
    result.revoke.extend(running)
    if unfinished_compensations(session, job_id):
        result.compensate.append(job_id)
    return job
