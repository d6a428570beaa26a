"""Request and response bodies, kept apart from the rows so the storage can change freely."""

import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer

from service.jobs import JobView, StepView


def _utc_iso(value: datetime) -> str:
    """Naive values are taken as UTC; every timestamp leaves the API aware, in UTC."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat()


UtcDatetime = Annotated[datetime, PlainSerializer(_utc_iso, return_type=str, when_used="json")]


class JobCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pipeline: str | dict[str, Any] = Field(
        description=(
            "a saved pipeline's name (or owner/name), an inline profile object, or inline YAML"
        )
    )
    params: dict[str, Any] = Field(default_factory=dict)
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=256)
    diff_mode: bool = Field(
        default=False, description="mark runs without new result items; notify only on new ones"
    )
    notify_url: str | None = Field(
        default=None, description="http(s) URL that receives a signed POST when new items appear"
    )


class StepPublic(BaseModel):
    step_id: str
    status: str
    attempts: int
    started_at: UtcDatetime | None
    finished_at: UtcDatetime | None
    error: dict[str, Any] | None
    shards: dict[str, int] | None

    @classmethod
    def of(cls, step: StepView) -> "StepPublic":
        return cls(
            step_id=step.step_id,
            status=step.status,
            attempts=step.attempts,
            started_at=step.started_at,
            finished_at=step.finished_at,
            error=step.error,
            shards=step.shards,
        )


class JobPublic(BaseModel):
    id: uuid.UUID
    pipeline: str
    status: str
    params: dict[str, Any]
    trigger: str
    parent_job_id: uuid.UUID | None
    pipeline_version: int | None
    schedule_id: uuid.UUID | None
    scheduled_for: UtcDatetime | None
    created_at: UtcDatetime
    started_at: UtcDatetime | None
    finished_at: UtcDatetime | None
    result: Any
    error: dict[str, Any] | None
    diff_mode: bool
    item_count: int | None
    new_count: int | None
    removed_count: int | None
    steps: list[StepPublic]

    @classmethod
    def of(cls, view: JobView) -> "JobPublic":
        job = view.job
        return cls(
            id=job.id,
            pipeline=job.pipeline,
            status=job.status,
            params=job.params,
            trigger=job.trigger,
            parent_job_id=job.parent_job_id,
            pipeline_version=job.pipeline_version,
            schedule_id=job.schedule_id,
            scheduled_for=job.scheduled_for,
            created_at=job.created_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            result=job.result,
            error=job.error,
            diff_mode=bool(job.diff_mode),
            item_count=job.item_count,
            new_count=job.new_count,
            removed_count=job.removed_count,
            steps=[StepPublic.of(step) for step in view.steps],
        )


class JobEnvelope(BaseModel):
    job: JobPublic


class JobList(BaseModel):
    jobs: list[JobPublic]
    next_cursor: str | None


class Check(BaseModel):
    ok: bool
    latency_ms: float
    error: str | None = None


class Health(BaseModel):
    status: Literal["ok", "degraded"]
    version: str
    uptime_s: float
    checks: dict[str, Check]


class ErrorDetail(BaseModel):
    code: str
    message: str
    details: dict[str, Any]


class ErrorEnvelope(BaseModel):
    error: ErrorDetail
