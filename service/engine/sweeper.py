"""Finds jobs whose messages were lost, and steps stuck past their timeout.

The broker is allowed to forget (Redis restarted without persistence, a worker killed with its
messages unacknowledged); PostgreSQL is not. Every open job whose state says "someone should be
working on this" while nobody is gets re-published. Re-publishing is safe because every step
claims its row before running and a settled step is never run again.
"""

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import exists, func, or_, select
from sqlalchemy.orm import Session

from service.engine.compensations import lost as lost_compensations
from service.engine.completion import fail_step
from service.engine.steps import Lease, StepKey
from service.language.snapshots import job_profile
from service.platform.constants import STEP_TIMEOUT_GRACE_S, SWEEP_ADVISORY_LOCK_ID
from service.platform.models import JobRow, StepRunRow
from service.platform.states import JOB_OPEN, JobStatus, StepStatus

OPEN_JOB = [status.value for status in JOB_OPEN]
RUNNABLE = [JobStatus.QUEUED.value, JobStatus.RUNNING.value]
"""A job waiting for a decision needs no message; the stall sweep still looks at it."""


@dataclass
class SweepReport:
    redispatch: set[uuid.UUID] = field(default_factory=set)
    compensate: set[uuid.UUID] = field(default_factory=set)
    timed_out: int = 0
    skipped: bool = False
    causes: dict[uuid.UUID, str] = field(default_factory=dict)
    """Why each job is sent again: the first cause found for it."""

    def add(self, cause: str, job_ids: set[uuid.UUID]) -> None:
        for job_id in job_ids - self.redispatch:
            self.causes[job_id] = cause
        self.redispatch |= job_ids


def sweep(
    session: Session,
    *,
    now: datetime,
    broker_lost: bool,
    stall_after_s: float,
    dispatch_grace_s: float,
    oldest_waiting: datetime | None = None,
    held: frozenset[uuid.UUID] | None = None,
) -> SweepReport:
    """One pass. Only one sweeper works at a time; the others return ``skipped``.

    ``oldest_waiting`` is when the oldest message still in the steps queue was sent. A job
    last sent after it may be waiting in that queue rather than lost, so it is not stalled,
    however long ago that was: behind a backlog longer than ``stall_after_s``, sending every
    waiting job again would double the backlog at each pass.

    ``held`` is every job whose message a worker has taken and not acknowledged, read from the
    broker after ``oldest_waiting``. With both known, a job in neither place, with no live
    lease and nothing done for the grace, has lost its message in flight (taken by a worker
    killed before it noted it, or never sent by a process killed between its checkpoint and
    its publish): it is sent again at this pass rather than at ``stall_after_s``."""
    report = SweepReport()
    if not session.scalar(select(func.pg_try_advisory_xact_lock(SWEEP_ADVISORY_LOCK_ID))):
        report.skipped = True
        return report
    report.timed_out = _fail_timed_out(session, now, report)
    if broker_lost:
        report.compensate |= lost_compensations(session, now, now)
        open_jobs = session.scalars(select(JobRow.id).where(JobRow.status.in_(OPEN_JOB)))
        report.add("broker_lost", set(open_jobs))
        return report
    sent_before = _still_queued_after(now - timedelta(seconds=dispatch_grace_s), oldest_waiting)
    report.compensate |= lost_compensations(session, now, sent_before)
    report.add("undispatched", _undispatched(session, now - timedelta(seconds=dispatch_grace_s)))
    report.add("lease_expired", _expired_leases(session, now, sent_before))
    if held is not None:
        quiet_since = min(now, oldest_waiting or now) - timedelta(seconds=dispatch_grace_s)
        report.add("lost_in_flight", _idle(session, now, quiet_since, RUNNABLE) - held)
    stalled_before = _still_queued_after(now - timedelta(seconds=stall_after_s), oldest_waiting)
    report.add("stalled", _stalled(session, now, stalled_before))
    return report


def _still_queued_after(before: datetime, oldest_waiting: datetime | None) -> datetime:
    """A job last sent at or after the oldest message still queued may be waiting in the
    queue, however long ago that was."""
    return before if oldest_waiting is None else min(before, oldest_waiting)


def _undispatched(session: Session, before: datetime) -> set[uuid.UUID]:
    return set(
        session.scalars(
            select(JobRow.id).where(
                JobRow.status.in_(OPEN_JOB),
                JobRow.dispatched_at.is_(None),
                JobRow.created_at < before,
            )
        )
    )


def _expired_leases(session: Session, now: datetime, sent_before: datetime) -> set[uuid.UUID]:
    """A job sent again after its step's lease lapsed, at or after ``sent_before``, is left to
    that message until it has had time to arrive."""
    return set(
        session.scalars(
            select(StepRunRow.job_id)
            .join(JobRow, JobRow.id == StepRunRow.job_id)
            .where(
                JobRow.status.in_(OPEN_JOB),
                StepRunRow.status == StepStatus.RUNNING,
                StepRunRow.lease_until < now,
                or_(
                    JobRow.dispatched_at.is_(None),
                    JobRow.dispatched_at <= StepRunRow.lease_until,
                    JobRow.dispatched_at < sent_before,
                ),
            )
            .distinct()
        )
    )


def _stalled(session: Session, now: datetime, before: datetime) -> set[uuid.UUID]:
    return _idle(session, now, before, OPEN_JOB)


def _idle(session: Session, now: datetime, before: datetime, statuses: list[str]) -> set[uuid.UUID]:
    """Jobs sent, with no live lease, and nothing started, finished or sent since ``before``."""
    live_lease = exists().where(
        StepRunRow.job_id == JobRow.id,
        StepRunRow.status == StepStatus.RUNNING,
        StepRunRow.lease_until >= now,
    )
    last_activity = (
        select(func.max(func.greatest(StepRunRow.started_at, StepRunRow.finished_at)))
        .where(StepRunRow.job_id == JobRow.id)
        .scalar_subquery()
    )
    return set(
        session.scalars(
            select(JobRow.id).where(
                JobRow.status.in_(statuses),
                JobRow.dispatched_at.is_not(None),
                ~live_lease,
                func.coalesce(last_activity, JobRow.dispatched_at) < before,
                JobRow.dispatched_at < before,
            )
        )
    )


def _fail_timed_out(session: Session, now: datetime, report: SweepReport) -> int:
    """A step past its timeout whose worker never gave up on it (a hung call, a lost signal).
    One that fails its job for good sends the job's compensations in this pass.

    A fan-out step waiting for its items (running with no lease of its own) is not an attempt:
    its timeout holds each item's attempt, and its items may wait their turn behind
    ``max_parallel`` or a queue backlog for longer than one attempt may run."""
    rows = session.execute(
        select(StepRunRow, JobRow)
        .join(JobRow, JobRow.id == StepRunRow.job_id)
        .where(
            JobRow.status.in_(OPEN_JOB),
            StepRunRow.status == StepStatus.RUNNING,
            StepRunRow.lease_token.is_not(None),
            StepRunRow.lease_until.is_not(None),
            StepRunRow.started_at < now - timedelta(seconds=STEP_TIMEOUT_GRACE_S),
        )
    )
    count = 0
    for row, job in list(rows):
        spec = job_profile(job).step(row.step_id)
        assert row.started_at is not None and row.lease_token is not None
        if row.started_at + timedelta(seconds=spec.timeout_s + STEP_TIMEOUT_GRACE_S) > now:
            continue
        retry = row.attempts < spec.retry.attempts
        error = {
            "code": "timeout",
            "message": f"step ran past its timeout of {spec.timeout_s}s",
            "details": {"timeout_s": spec.timeout_s},
        }
        key = StepKey(row.job_id, row.step_id, row.shard)
        lease = Lease(row.lease_token, row.attempts)
        delay = spec.retry.delay_s(row.attempts) if retry else None
        failed = fail_step(session, key, lease, error, retry_delay_s=delay, now=now)
        report.add("timed_out", {row.job_id})
        if failed.ready.compensate:
            report.compensate.add(row.job_id)
        count += 1
    return count
