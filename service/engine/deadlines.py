"""Job deadlines: a job still open at its ``deadline_at`` is failed as ``job_timeout``.

The elected beat replica checks them on every tick, beside approval timeouts, so that no
worker slot is held waiting for a deadline and one that passes while every worker is busy
or down is still enforced. Ending the job takes the path a cancel takes (``jobs.end_job``):
its open steps close in the same transaction, so a waiting step is never claimed and a
running step's checkpoint, fenced by its lease, writes nothing; its running tasks are revoked
and its compensations sent once the caller has committed. Unlike a cancel, which follows
``on_cancel``, a deadline compensates as any failure of a saga does.

Functions flush; the caller commits, then revokes and publishes.
"""

import uuid
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import ColumnElement, and_, func, select
from sqlalchemy.orm import Session

from service.engine.compensations import unfinished
from service.engine.jobs import end_job
from service.platform.models import JobRow
from service.platform.states import JOB_OPEN, JobStatus

EXPIRE_BATCH = 100
JOB_TIMEOUT = "job_timeout"


@dataclass
class Expired:
    """What the caller sends after its commit: the jobs failed, the tasks to revoke, and the
    jobs whose compensations are due."""

    failed: list[uuid.UUID] = field(default_factory=list)
    revoke: list[str] = field(default_factory=list)
    compensate: list[uuid.UUID] = field(default_factory=list)


def _open_with_deadline() -> ColumnElement[bool]:
    """The predicate of ``ix_jobs_open_deadline``, written out so the planner uses it."""
    return and_(JobRow.deadline_at.is_not(None), JobRow.status.in_(sorted(JOB_OPEN)))


def expire_deadlines(session: Session, now: datetime) -> Expired:
    """Fail up to ``EXPIRE_BATCH`` open jobs past their deadline, earliest first. Jobs locked
    by another transaction (a step settling them right now) are skipped, not waited for: the
    next tick finds them again if they are still open."""
    expired = Expired()
    jobs = session.scalars(
        select(JobRow)
        .where(_open_with_deadline(), JobRow.deadline_at <= now)
        .order_by(JobRow.deadline_at)
        .limit(EXPIRE_BATCH)
        .with_for_update(skip_locked=True)
    ).all()
    for job in jobs:
        assert job.deadline_at is not None
        timeout_s = round((job.deadline_at - job.created_at).total_seconds())
        error = {
            "code": JOB_TIMEOUT,
            "message": f"the job was still {job.status} at its deadline "
            f"{job.deadline_at.isoformat()} ({timeout_s}s after it was submitted)",
            "details": {"deadline_at": job.deadline_at.isoformat(), "timeout_s": timeout_s},
        }
        running = end_job(session, job, JobStatus.FAILED, error, compensate=True, now=now)
        expired.failed.append(job.id)
        expired.revoke.extend(running)
        if unfinished(session, job.id):
            expired.compensate.append(job.id)
    session.flush()
    return expired


def next_deadline(session: Session) -> datetime | None:
    """The earliest deadline of an open job, for the beat leader to wake up at."""
    return session.scalar(select(func.min(JobRow.deadline_at)).where(_open_with_deadline()))
