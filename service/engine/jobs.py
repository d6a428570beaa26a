"""Jobs: read, list, cancel (accepting them is ``submission``). Functions flush; the caller
commits, then publishes."""

import base64
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Select, and_, or_, select
from sqlalchemy.orm import Session

from service.engine.compensations import compensation_of, record_compensations
from service.engine.family import Family, job_family
from service.engine.filters import EVERY_JOB, JobFilter
from service.engine.settle import close_open_steps
from service.language.profiles import Profile
from service.language.snapshots import job_profile
from service.platform import metrics
from service.platform.constants import SHARD_NONE
from service.platform.db import custom_plans
from service.platform.errors import (
    FlowbeatError,
    InvalidCursor,
    JobConflict,
    JobExpired,
    JobNotFound,
)
from service.platform.models import (
    JobRow,
    PrunedJobRow,
    StepCacheRow,
    StepRoundRow,
    StepRunRow,
)
from service.platform.states import JOB_FINAL, JobStatus, StepStatus


@dataclass(frozen=True)
class RoundView:
    round: int
    status: str
    attempts: int
    started_at: datetime | None
    finished_at: datetime | None
    error: dict[str, Any] | None


@dataclass(frozen=True)
class StepView:
    step_id: str
    status: str
    attempts: int
    started_at: datetime | None
    finished_at: datetime | None
    error: dict[str, Any] | None
    shards: dict[str, int] | None
    round: int = 1
    rounds: list[RoundView] = field(default_factory=list)
    """Earlier rounds of a step in a loop, oldest first; the row itself is the current one."""
    wake_at: datetime | None = None
    """When a ``wait`` step wakes, or woke."""
    cached_from: dict[str, str] | None = None
    """For a ``cached`` step, the ``job_id`` and ``step_id`` whose output it took."""


@dataclass(frozen=True)
class JobView:
    job: JobRow
    steps: list[StepView]
    compensation: dict[str, Any] | None = None
    """A saga's outcome: ``{status: running|completed|failed, steps: [...]}``."""
    family: Family = field(default_factory=Family)
    """The job it came from and how, and the children its steps started."""


def get_job(session: Session, job_id: uuid.UUID, *, owner: str | None = None) -> JobRow:
    job = session.get(JobRow, job_id)
    if job is None or (owner is not None and job.owner != owner):
        raise missing_job(session, job_id, owner=owner)
    return job


def missing_job(session: Session, job_id: uuid.UUID, *, owner: str | None) -> FlowbeatError:
    """Why a job id finds no job: retention pruned it (``job_expired``, with when), or it was
    never there. Another owner's tombstone is as unknown as another owner's job."""
    tombstone = session.get(PrunedJobRow, job_id)
    if tombstone is None or (owner is not None and tombstone.owner != owner):
        return JobNotFound(f"no job {job_id}", {"job_id": str(job_id)})
    finished = tombstone.finished_at
    return JobExpired(
        f"job {job_id} finished and was pruned by retention at {tombstone.pruned_at.isoformat()}",
        {
            "job_id": str(job_id),
            "pipeline": tombstone.pipeline,
            "finished_at": finished.isoformat() if finished else None,
            "pruned_at": tombstone.pruned_at.isoformat(),
        },
    )


def job_view(session: Session, job: JobRow) -> JobView:
    rows = session.scalars(
        select(StepRunRow).where(StepRunRow.job_id == job.id).order_by(StepRunRow.id)
    ).all()
    profile = job_profile(job)
    past = rounds_of(session, job.id) if profile.loops else {}
    cached = any(row.status == StepStatus.CACHED for row in rows)
    sources = cache_sources(session, job.id) if cached else {}
    shards: dict[str, dict[str, int]] = {}
    for row in rows:
        if row.shard != SHARD_NONE:
            counts = shards.setdefault(row.step_id, {"total": 0})
            counts["total"] += 1
            counts[row.status] = counts.get(row.status, 0) + 1
    steps = [
        StepView(
            step_id=row.step_id,
            status=row.status,
            attempts=row.attempts,
            started_at=row.started_at,
            finished_at=row.finished_at,
            error=row.error,
            shards=shards.get(row.step_id),
            round=row.round,
            rounds=[
                RoundView(r.round, r.status, r.attempts, r.started_at, r.finished_at, r.error)
                for r in past.get(row.step_id, [])
            ],
            wake_at=row.wake_at,
            cached_from=sources.get(row.step_id),
        )
        for row in rows
        if row.shard == SHARD_NONE
    ]
    undoable = any(step.compensate is not None for step in profile.steps)
    compensation = compensation_of(session, job.id) if undoable else None
    return JobView(job, steps, compensation, job_family(session, job))


def cache_sources(session: Session, job_id: uuid.UUID) -> dict[str, dict[str, str]]:
    """Where each cached step of a job took its output from."""
    rows = session.execute(
        select(StepCacheRow.step_id, StepCacheRow.source_job_id, StepCacheRow.source_step_id).where(
            StepCacheRow.job_id == job_id,
            StepCacheRow.shard == SHARD_NONE,
            StepCacheRow.source_job_id.is_not(None),
        )
    )
    return {
        step_id: {"job_id": str(source_job), "step_id": str(source_step)}
        for step_id, source_job, source_step in rows
    }


def step_task_ids(session: Session, job_id: uuid.UUID) -> dict[str, str]:
    """The Celery task id of each step's latest attempt, for links to Flower."""
    rows = session.execute(
        select(StepRunRow.step_id, StepRunRow.task_id).where(
            StepRunRow.job_id == job_id,
            StepRunRow.shard == SHARD_NONE,
            StepRunRow.task_id.is_not(None),
        )
    )
    return {step_id: task_id for step_id, task_id in rows if task_id is not None}


def new_job_view(job: JobRow, profile: Profile) -> JobView:
    """The view of a job just submitted, without reading back what was just written."""
    steps = [
        StepView(step.id, StepStatus.PENDING, 0, None, None, None, None) for step in profile.steps
    ]
    return JobView(job=job, steps=steps)


def encode_cursor(job: JobRow) -> str:
    raw = f"{job.created_at.isoformat()}|{job.id}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        created, job_id = raw.split("|")
        return datetime.fromisoformat(created), uuid.UUID(job_id)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidCursor("cursor is not one this API returned", {"cursor": cursor}) from exc


def list_jobs(
    session: Session,
    *,
    owner: str | None,
    match: JobFilter = EVERY_JOB,
    limit: int,
    cursor: str | None = None,
) -> tuple[list[JobRow], str | None]:
    """Newest first, keyset-paged on (created_at, id) so pages stay stable under inserts;
    ``match`` says which jobs (``service.engine.filters``)."""
    query = list_query(owner, match, limit + 1)
    if match.labels or match.error_code:
        custom_plans(session)
    if cursor:
        created, job_id = _decode_cursor(cursor)
        query = query.where(
            or_(
                JobRow.created_at < created,
                and_(JobRow.created_at == created, JobRow.id < job_id),
            )
        )
    jobs = list(session.scalars(query))
    next_cursor = encode_cursor(jobs[limit - 1]) if len(jobs) > limit else None
    return jobs[:limit], next_cursor


def list_query(owner: str | None, match: JobFilter, limit: int) -> Select[JobRow]:
    """The first page of ``list_jobs``, as its statement: what ``bench.label_filter`` plans."""
    return (
        select(JobRow)
        .where(*match.clauses(owner))
        .order_by(JobRow.created_at.desc(), JobRow.id.desc())
        .limit(limit)
    )


def cancel_job(
    session: Session, job_id: uuid.UUID, *, owner: str | None, now: datetime
) -> tuple[JobRow, list[str]]:
    """Cancel a job. Returns it with the task ids of steps still running, for revoking."""
    job = session.scalars(select(JobRow).where(JobRow.id == job_id).with_for_update()).one_or_none()
    if job is None or (owner is not None and job.owner != owner):
        raise missing_job(session, job_id, owner=owner)
    if job.status == JobStatus.CANCELLED:
        return job, []
    if job.status in JOB_FINAL:
        raise JobConflict(
            f"job {job_id} already {job.status}", {"job_id": str(job_id), "status": job.status}
        )
    profile = job_profile(job)
    running = end_job(
        session,
        job,
        JobStatus.CANCELLED,
        {"code": "cancelled", "message": "cancelled on request", "details": {}},
        compensate=profile.on_cancel == "compensate",
        now=now,
    )
    return job, running


def end_job(
    session: Session,
    job: JobRow,
    status: JobStatus,
    error: dict[str, Any],
    *,
    compensate: bool,
    now: datetime,
) -> list[str]:
    """End an open job, locked by the caller, before its steps settle it: a cancel or a
    deadline. Its open steps close at once, so a waiting step is never claimed and a running
    one's checkpoint finds no lease to write under; returns the task ids of the steps that were
    running, which the caller revokes after its commit."""
    running = session.scalars(
        select(StepRunRow.task_id).where(
            StepRunRow.job_id == job.id,
            StepRunRow.status == StepStatus.RUNNING,
            StepRunRow.task_id.is_not(None),
        )
    ).all()
    job.status = status
    job.finished_at = now
    job.error = error
    metrics.job_finished(session, job.pipeline, job.trigger, job.status)
    close_open_steps(session, job.id, StepStatus.CANCELLED, now)
    if compensate:
        record_compensations(session, job, job_profile(job), now)
    return [task_id for task_id in running if task_id]


def rounds_of(session: Session, job_id: uuid.UUID) -> dict[str, list[StepRoundRow]]:
    """Every finished round of a job's loop steps, by step, oldest first."""
    rows = session.scalars(
        select(StepRoundRow)
        .where(StepRoundRow.job_id == job_id)
        .order_by(StepRoundRow.step_id, StepRoundRow.round)
    )
    found: dict[str, list[StepRoundRow]] = {}
    for row in rows:
        found.setdefault(row.step_id, []).append(row)
    return found
