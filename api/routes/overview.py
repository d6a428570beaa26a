"""``GET /v1/overview``: the whole system at a glance, the figures of the dashboard's home page.

Jobs are counted as the job list filters them (submitted in the window, by status now), so a
client that lists ``GET /v1/jobs`` with the same status and window finds the same number. The
queues and workers come from the broker; with the broker away the rest still answers, and
``broker_error`` says why those two are missing.
"""

import uuid
from datetime import datetime

import redis
from fastapi import APIRouter, Request
from pydantic import BaseModel, Field
from sqlalchemy.orm import Session

from api.deps import Reader, SessionDep, broker_probe
from api.openapi import errors
from api.routes.jobs import visible_to
from api.routes.queues import QueuePublic
from api.schemas import ApprovalPublic, UtcDatetime
from service.alerts.rules import recent_deliveries
from service.engine import overview as figures
from service.engine.approvals import count_waiting, list_approvals
from service.platform.clock import utcnow
from service.platform.settings import Settings
from service.platform.states import APPROVAL_WAITING
from service.triggers.schedules import next_fires
from tasks.broker import WorkerState, queue_states, worker_states

router = APIRouter(tags=["overview"])

LISTED = 5
"""Approvals, schedule fires and alerts shown; the count of approvals is of all of them."""


class BucketPublic(BaseModel):
    at: UtcDatetime = Field(description="start of the interval; it ends at the next one's")
    started: int = Field(description="jobs submitted in the interval, whatever their status")
    succeeded: int = Field(description="of those, the ones that succeeded")
    failed: int = Field(description="of those, the ones that failed")


class Totals(BaseModel):
    started: int
    succeeded: int
    failed: int


class PipelineSpeedPublic(BaseModel):
    pipeline: str
    runs: int = Field(description="succeeded jobs of the window")
    p50_s: float
    p95_s: float
    max_s: float


class PipelineFailuresPublic(BaseModel):
    pipeline: str
    failed: int
    runs: int = Field(description="every job of the pipeline submitted in the window")


class TakenPublic(BaseModel):
    task: str
    task_id: str | None
    job_id: uuid.UUID | None
    step_id: str | None = Field(description="the step the message was sent for")
    running_steps: list[str] = Field(
        description=(
            "the steps running under it now: that step, or the later steps of its chain that "
            "run in the same message; none while it waits to start or to retry"
        )
    )


class WorkerPublic(BaseModel):
    name: str
    queues: list[str]
    last_beat_at: UtcDatetime
    running: list[TakenPublic] = Field(
        description="the messages it has taken and not acknowledged, and what runs under them"
    )

    @classmethod
    def of(cls, state: WorkerState, steps: dict[str, list[str]]) -> "WorkerPublic":
        return cls(
            name=state.name,
            queues=state.queues,
            last_beat_at=state.beat_at,
            running=[
                TakenPublic(**vars(taken), running_steps=steps.get(taken.task_id or "", []))
                for taken in state.taken
            ],
        )


class ApprovalsWaiting(BaseModel):
    waiting: int = Field(description="every gate that waits for a person")
    oldest: list[ApprovalPublic]


class ScheduleFire(BaseModel):
    schedule_id: uuid.UUID
    pipeline: str
    name: str | None
    next_fire_at: UtcDatetime


class AlertSent(BaseModel):
    rule: str
    delivery_id: str = Field(description="as in GET /v1/alerts/{rule}/deliveries")
    subject: str
    summary: str
    status: str = Field(description="pending, delivered or failed (gave up)")
    job_id: uuid.UUID | None = Field(description="the job it is about, if it is about one")
    created_at: UtcDatetime


class Overview(BaseModel):
    window: figures.Span
    at: UtcDatetime = Field(description="when the figures were read")
    since: UtcDatetime = Field(description="the first interval's start")
    until: UtcDatetime = Field(description="the last interval's end: the window is [since, until)")
    bucket_s: int
    totals: Totals
    series: list[BucketPublic]
    open: dict[str, int] = Field(description="jobs queued, running and awaiting approval now")
    slowest: list[PipelineSpeedPublic]
    failing: list[PipelineFailuresPublic]
    queues: list[QueuePublic] | None
    workers: list[WorkerPublic] | None
    broker_error: str | None = Field(description="why queues and workers are missing, if they are")
    approvals: ApprovalsWaiting
    schedules: list[ScheduleFire]
    alerts: list[AlertSent] = Field(description="the last alerts of the rules the key sees")


def _broker(
    session: Session, settings: Settings, now: datetime
) -> tuple[list[QueuePublic] | None, list[WorkerPublic] | None, str | None]:
    """The queues and the workers, or why the broker could not tell."""
    try:
        with broker_probe(settings) as client:
            queues = queue_states(client, settings.worker_dead_after_s)
            workers = worker_states(client, settings.worker_dead_after_s)
    except redis.RedisError as exc:
        return None, None, f"the broker did not answer: {exc}"
    held = [(t.job_id, t.task_id) for w in workers for t in w.taken if t.job_id and t.task_id]
    steps = figures.running_under(session, held)
    return (
        [QueuePublic.of(q, now) for q in queues],
        [WorkerPublic.of(w, steps) for w in workers],
        None,
    )


def _approvals(session: Session, owner: str | None) -> ApprovalsWaiting:
    oldest = list_approvals(
        session, statuses=sorted(APPROVAL_WAITING), visible_to=owner, limit=LISTED
    )
    return ApprovalsWaiting(
        waiting=count_waiting(session, visible_to=owner),
        oldest=[ApprovalPublic.of(approval, job.pipeline) for approval, job in oldest],
    )


def _alerts(session: Session, owner: str | None) -> list[AlertSent]:
    return [
        AlertSent(
            rule=rule,
            delivery_id=row.delivery_id,
            subject=row.subject,
            summary=str(row.payload.get("summary", "")),
            status=row.status,
            job_id=row.payload.get("job_id"),
            created_at=row.created_at,
        )
        for row, rule in recent_deliveries(session, owner=owner, limit=LISTED)
    ]


def _fires(session: Session, owner: str | None) -> list[ScheduleFire]:
    return [
        ScheduleFire(
            schedule_id=row.id, pipeline=row.pipeline, name=row.name, next_fire_at=row.next_fire_at
        )
        for row in next_fires(session, owner=owner, limit=LISTED)
        if row.next_fire_at is not None
    ]


@router.get("/v1/overview", response_model=Overview, responses=errors({400: "invalid_query"}))
def read_overview(
    request: Request,
    principal: Reader,
    session: SessionDep,
    window: figures.Span = figures.Span.HOUR,
) -> Overview:
    """The last hour in minutes, or the last day in quarter hours, with what is open now."""
    now = utcnow()
    owner = visible_to(principal)
    span = figures.Window.ending(window, now)
    series = figures.throughput(session, span, owner=owner)
    queues, workers, broker_error = _broker(session, request.app.state.settings, now)
    return Overview(
        window=window,
        at=now,
        since=span.since,
        until=span.until,
        bucket_s=int(span.bucket.total_seconds()),
        totals=Totals(
            started=sum(b.started for b in series),
            succeeded=sum(b.succeeded for b in series),
            failed=sum(b.failed for b in series),
        ),
        series=[BucketPublic(**vars(bucket)) for bucket in series],
        open=figures.open_jobs(session, owner=owner),
        slowest=[
            PipelineSpeedPublic(**vars(p))
            for p in figures.slowest_pipelines(session, span, owner=owner)
        ],
        failing=[
            PipelineFailuresPublic(**vars(p))
            for p in figures.failing_pipelines(session, span, owner=owner)
        ],
        queues=queues,
        workers=workers,
        broker_error=broker_error,
        approvals=_approvals(session, owner),
        schedules=_fires(session, owner),
        alerts=_alerts(session, owner),
    )
