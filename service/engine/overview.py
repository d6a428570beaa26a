"""The jobs half of the dashboard home and ``GET /v1/overview``: how many jobs were submitted,
succeeded and failed in each interval of the last hour or day, which pipelines ran slowest and
failed most, and how many jobs are open now.

Every figure counts jobs by the time they were submitted (``created_at``) and their status now,
the two things the job list filters on, so each one is exactly what the list shows for its
window and status: an operator who follows a figure finds that many jobs. Each query reads a
bounded range of ``created_at`` through an index on it (``(status, created_at)`` or
``(created_at, id)``) and aggregates in PostgreSQL, so the cost follows the jobs of the window,
not every job ever run.
"""

import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import Select, func, literal, select, text
from sqlalchemy.orm import Session

from service.platform.models import JobRow, StepRunRow
from service.platform.states import JOB_OPEN, JobStatus, StepStatus

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
"""Buckets start on whole multiples of their width from here: on the minute, the quarter hour."""
LEADERS = 5
"""Pipelines listed as the slowest and as the most failing."""


class Span(StrEnum):
    HOUR = "hour"
    DAY = "day"


BUCKETS = {Span.HOUR: (timedelta(minutes=1), 60), Span.DAY: (timedelta(minutes=15), 96)}
"""A day is drawn in quarter hours: 1,440 one-minute bars would each be narrower than a pixel."""


@dataclass(frozen=True)
class Window:
    """Half-open, ``[since, until)``: the last bucket is the one ``now`` falls in, whole, so
    a link to the list made from it still holds the jobs submitted after the page was drawn."""

    span: Span
    since: datetime
    until: datetime
    bucket: timedelta

    @classmethod
    def ending(cls, span: Span, now: datetime) -> "Window":
        bucket, count = BUCKETS[span]
        current = EPOCH + (now - EPOCH) // bucket * bucket
        return cls(span, current - (count - 1) * bucket, current + bucket, bucket)

    def starts(self) -> list[datetime]:
        count = (self.until - self.since) // self.bucket
        return [self.since + n * self.bucket for n in range(count)]


@dataclass(frozen=True)
class Bucket:
    at: datetime
    started: int
    """Jobs submitted in the bucket, whatever their status now."""
    succeeded: int
    failed: int


@dataclass(frozen=True)
class PipelineSpeed:
    """Durations from a job's first step to its end, of the pipeline's succeeded jobs."""

    pipeline: str
    runs: int
    p50_s: float
    p95_s: float
    max_s: float


@dataclass(frozen=True)
class PipelineFailures:
    pipeline: str
    failed: int
    runs: int
    """Every job of the pipeline submitted in the window, whatever its status."""


def _scoped(query: Select[Any], window: Window, owner: str | None) -> Select[Any]:
    query = query.where(JobRow.created_at >= window.since, JobRow.created_at < window.until)
    return query if owner is None else query.where(JobRow.owner == owner)


def _count_where(status: JobStatus) -> Any:
    return func.count().filter(JobRow.status == status)


def throughput(session: Session, window: Window, *, owner: str | None) -> list[Bucket]:
    """One bucket for each interval of the window, the empty ones too. Grouped by position:
    the bucket's expression written again would carry bind parameters of its own, which
    PostgreSQL does not know to be the same."""
    start = func.date_bin(literal(window.bucket), JobRow.created_at, literal(EPOCH))
    query = _scoped(
        select(
            start,
            func.count(),
            _count_where(JobStatus.SUCCEEDED),
            _count_where(JobStatus.FAILED),
        ).group_by(text("1")),
        window,
        owner,
    )
    counted = {at: (started, ok, bad) for at, started, ok, bad in session.execute(query)}
    return [Bucket(at, *counted.get(at, (0, 0, 0))) for at in window.starts()]


def slowest_pipelines(
    session: Session, window: Window, *, owner: str | None, limit: int = LEADERS
) -> list[PipelineSpeed]:
    """Ranked by the 95th percentile: one slow run in a hundred is what a deadline meets."""
    seconds = func.extract("epoch", JobRow.finished_at - JobRow.started_at)
    p95 = func.percentile_cont(0.95).within_group(seconds)
    query = _scoped(
        select(
            JobRow.pipeline,
            func.count(),
            func.percentile_cont(0.5).within_group(seconds),
            p95,
            func.max(seconds),
        )
        .where(JobRow.status == JobStatus.SUCCEEDED, JobRow.started_at.is_not(None))
        .group_by(JobRow.pipeline)
        .order_by(p95.desc(), JobRow.pipeline)
        .limit(limit),
        window,
        owner,
    )
    return [
        PipelineSpeed(name, runs, round(p50, 3), round(p95_s, 3), round(float(top), 3))
        for name, runs, p50, p95_s, top in session.execute(query)
    ]


def failing_pipelines(
    session: Session, window: Window, *, owner: str | None, limit: int = LEADERS
) -> list[PipelineFailures]:
    failed = _count_where(JobStatus.FAILED)
    query = _scoped(
        select(JobRow.pipeline, failed, func.count())
        .group_by(JobRow.pipeline)
        .having(failed > 0)
        .order_by(failed.desc(), JobRow.pipeline)
        .limit(limit),
        window,
        owner,
    )
    return [PipelineFailures(name, bad, runs) for name, bad, runs in session.execute(query)]


def open_jobs(session: Session, *, owner: str | None) -> dict[str, int]:
    """Jobs queued, running and waiting for a person now, however long ago submitted."""
    statuses: Sequence[str] = sorted(JOB_OPEN)
    query = (
        select(JobRow.status, func.count())
        .where(JobRow.status.in_(statuses))
        .group_by(JobRow.status)
    )
    if owner is not None:
        query = query.where(JobRow.owner == owner)
    counts = dict.fromkeys(statuses, 0)
    counts.update({status: count for status, count in session.execute(query)})
    return counts


def running_under(
    session: Session, messages: Collection[tuple[uuid.UUID, str]]
) -> dict[str, list[str]]:
    """The steps running now under each message, by its task id: a step claims under the id of
    the message that runs it, and a chain's later steps run in their first step's message, so
    a worker's messages alone would name only the first. Read by job, through the index of
    ``(job_id, step_id, shard)``, since ``task_id`` has none."""
    if not messages:
        return {}
    query = (
        select(StepRunRow.task_id, StepRunRow.step_id)
        .where(
            StepRunRow.job_id.in_({job for job, _ in messages}),
            StepRunRow.task_id.in_({task for _, task in messages}),
            StepRunRow.status == StepStatus.RUNNING,
        )
        .distinct()
        .order_by(StepRunRow.task_id, StepRunRow.step_id)
    )
    running: dict[str, list[str]] = {}
    for task_id, step_id in session.execute(query):
        running.setdefault(task_id or "", []).append(step_id)
    return running
