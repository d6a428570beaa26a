"""Finds jobs whose messages were lost, and steps stuck past their timeout.

The broker is allowed to forget (Redis restarted without persistence, a worker killed with its
messages unacknowledged); PostgreSQL is not. Every open job whose state says "someone should be
working on this" while nobody is gets re-published. Re-publishing is safe because every step
claims its row before running and a settled step is never run again.
"""

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Exists, and_, exists, func, or_, select
from sqlalchemy.orm import Session

from service.engine.compensations import lost as lost_compensations
from service.engine.completion import fail_step
from service.engine.steps import Lease, StepKey
from service.engine.waits import TIMED_RETRY
from service.language.snapshots import job_profile, known_profile, parsed_profile
from service.platform.constants import STEP_TIMEOUT_GRACE_S, SWEEP_ADVISORY_LOCK_ID
from service.platform.models import JobRow, StepRunRow
from service.platform.states import JOB_OPEN, JobStatus, StepStatus

OPEN_JOB = [status.value for status in JOB_OPEN]
RUNNABLE = [JobStatus.QUEUED.value, JobStatus.RUNNING.value]
"""A job waiting for a decision needs no message; the stall sweep still looks at it."""
_SENDABLE = [StepStatus.PENDING.value, StepStatus.RETRYING.value, StepStatus.RUNNING.value]


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


Route = tuple[str, int]
"""A queue and a priority: one list of messages, taken from in the order they were sent."""


def sweep(
    session: Session,
    *,
    now: datetime,
    broker_lost: bool,
    stall_after_s: float,
    dispatch_grace_s: float,
    oldest_waiting: Mapping[Route, datetime] | None = None,
    held: frozenset[uuid.UUID] | None = None,
) -> SweepReport:
    """One pass. Only one sweeper works at a time; the others return ``skipped``.

    ``oldest_waiting`` is when the oldest message still in each queue's list for a priority
    was sent. A job last sent after the oldest message of a list its steps go to may be
    waiting in that list rather than lost, so it is not stalled, however long ago that was:
    behind a backlog longer than ``stall_after_s``, sending every waiting job again would
    double the backlog at each pass, and a queue no worker consumes yet holds its jobs for as
    long as it has none.

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
        open_jobs = session.scalars(
            select(JobRow.id).where(JobRow.status.in_(OPEN_JOB), JobRow.waiting_for.is_(None))
        )
        report.add("broker_lost", set(open_jobs))
        return report
    oldest = dict(oldest_waiting or {})
    grace = timedelta(seconds=dispatch_grace_s)
    sent_before = _still_queued_after(now - grace, min(oldest.values(), default=None))
    report.compensate |= lost_compensations(session, now, sent_before)
    report.add("undispatched", _undispatched(session, now - grace))
    report.add("lease_expired", _expired_leases(session, now, sent_before))
    if held is not None:
        quiet = _idle(session, now, _still_queued_after(now - grace, _latest(oldest)), RUNNABLE)
        report.add("lost_in_flight", _not_queued(session, quiet, oldest, grace) - held)
    stall_before = _still_queued_after(now - timedelta(seconds=stall_after_s), _latest(oldest))
    stalled = _stalled(session, now, stall_before)
    report.add("stalled", _not_queued(session, stalled, oldest, grace) - (held or frozenset()))
    return report


def _still_queued_after(before: datetime, oldest_waiting: datetime | None) -> datetime:
    """A job last sent at or after the oldest message still queued may be waiting in the
    queue, however long ago that was."""
    return before if oldest_waiting is None else min(before, oldest_waiting)


def _latest(oldest: Mapping[Route, datetime]) -> datetime | None:
    """A job no list could still hold was last active before this, at least."""
    return max(oldest.values(), default=None)


def _not_queued(
    session: Session,
    idle: Mapping[uuid.UUID, datetime],
    oldest: Mapping[Route, datetime],
    margin: timedelta,
) -> set[uuid.UUID]:
    """Of jobs idle since the time given for each, those whose message no list could still
    hold: every list their steps go to, at their priority, is empty, or its next message
    was sent more than ``margin`` after they last did anything (a job's message leaves
    after the commit that made it, so the next one may be its own, sent a moment later)."""
    if not oldest or not idle:
        return set(idle)
    rows = session.execute(
        select(JobRow.id, JobRow.priority, JobRow.profile_hash).where(JobRow.id.in_(list(idle)))
    )
    gone = set()
    for job_id, priority, profile_hash in rows:
        queues = _queues(session, profile_hash, job_id)
        sent = [oldest[(q, priority)] for q in queues if (q, priority) in oldest]
        if all(idle[job_id] < t - margin for t in sent):
            gone.add(job_id)
    return gone


def _queues(session: Session, profile_hash: str, job_id: uuid.UUID) -> frozenset[str]:
    """The queues a profile's steps go to, read once per profile."""
    profile = known_profile(profile_hash) or parsed_profile(
        profile_hash, session.scalar(select(JobRow.profile).where(JobRow.id == job_id)) or {}
    )
    return frozenset(profile.queue_of(step.id) for step in profile.steps)


def _undispatched(session: Session, before: datetime) -> set[uuid.UUID]:
    return set(
        session.scalars(
            select(JobRow.id).where(
                JobRow.status.in_(OPEN_JOB),
                JobRow.dispatched_at.is_(None),
                JobRow.waiting_for.is_(None),
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


def _stalled(session: Session, now: datetime, before: datetime) -> dict[uuid.UUID, datetime]:
    return _idle(session, now, before, OPEN_JOB)


def _idle(
    session: Session, now: datetime, before: datetime, statuses: list[str]
) -> dict[uuid.UUID, datetime]:
    """Jobs sent, with no live lease, and nothing started, finished or sent since ``before``,
    with when they last did any of that. A step waiting for a slot of its concurrency key is
    the beat's to send: its job is not idle."""
    live_lease = exists().where(
        StepRunRow.job_id == JobRow.id,
        or_(
            and_(StepRunRow.status == StepStatus.RUNNING, StepRunRow.lease_until >= now),
            StepRunRow.status == StepStatus.AWAITING_SLOT,
        ),
    )
    last_activity = (
        select(func.max(func.greatest(StepRunRow.started_at, StepRunRow.finished_at)))
        .where(StepRunRow.job_id == JobRow.id)
        .scalar_subquery()
    )
    active = func.greatest(func.coalesce(last_activity, JobRow.dispatched_at), JobRow.dispatched_at)
    rows = session.execute(
        select(JobRow.id, active).where(
            JobRow.status.in_(statuses),
            JobRow.dispatched_at.is_not(None),
            ~live_lease,
            active < before,
            or_(~_parked(), _sendable()),
        )
    )
    return {job_id: last for job_id, last in rows}


def _parked() -> Exists:
    return exists().where(
        StepRunRow.job_id == JobRow.id,
        or_(
            StepRunRow.status.in_(
                [
                    StepStatus.SLEEPING,
                    StepStatus.AWAITING_SIGNAL,
                    StepStatus.AWAITING_CHILD,
                    StepStatus.AWAITING_RATE,
                ]
            ),
            TIMED_RETRY,
        ),
    )


def _sendable() -> Exists:
    """A step of the job that a message could be carrying now. A job with a wait step asleep,
    a step parked for a signal, a child job or its rate limit's window, or backing off before
    its next child, and
    none of these, is not idle but waiting for the beat leader, the signal or the child:
    nothing of it is lost, and nothing sent again would run."""
    return exists().where(
        StepRunRow.job_id == JobRow.id,
        StepRunRow.status.in_(_SENDABLE),
        StepRunRow.waiting_on == 0,
        ~TIMED_RETRY,
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
