"""Request and response bodies, kept apart from the rows so the storage can change freely."""

import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer

from service.engine.family import Child, Parent
from service.engine.filters import JobFilter
from service.engine.jobs import JobView, StepView
from service.engine.steplogs import LogLine
from service.language.labels import check_labels
from service.platform.constants import (
    LABEL_KEY_MAX_CHARS,
    LABEL_VALUE_MAX_CHARS,
    LABELS_MAX,
    MAX_PRIORITY,
    SYNC_WAIT_DEFAULT_S,
    SYNC_WAIT_MAX_S,
)
from service.platform.models import ApprovalRow, BulkActionRow, JobSignalRow


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
    idempotency_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="the same key with the same request gives back the first job, for "
        "FLOWBEAT_IDEMPOTENCY_TTL_S from its submission (a day by default)",
    )
    labels: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            f"string keys and values that say whom the job is for ({{tenant: acme}}); at most "
            f"{LABELS_MAX}, keys of letters, digits and _ . - / up to {LABEL_KEY_MAX_CHARS} "
            f"chars, values up to {LABEL_VALUE_MAX_CHARS}; GET /v1/jobs?label=key:value finds them"
        ),
    )
    diff_mode: bool = Field(
        default=False, description="mark runs without new result items; notify only on new ones"
    )
    refresh: bool = Field(
        default=False,
        description="run every step again: steps that declare cache take nothing from the step "
        "cache, and what they return is cached anew",
    )
    notify_url: str | None = Field(
        default=None, description="http(s) URL that receives a signed POST when new items appear"
    )
    priority: int | None = Field(
        default=None,
        ge=0,
        le=MAX_PRIORITY,
        description="0-9, higher is taken first within a queue; default: the profile's (0)",
    )
    mode: Literal["async", "sync"] = Field(
        default="async",
        description=(
            "sync: hold the request until the job is final (200 with the job and its result) "
            "or wait_s passes (202 with the job as it stands)"
        ),
    )
    wait_s: float = Field(
        default=SYNC_WAIT_DEFAULT_S,
        gt=0,
        le=SYNC_WAIT_MAX_S,
        description="how long a sync request waits for the job to be final",
    )


class RerunCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    from_step: str | None = Field(
        default=None, description="the step to run again with all it feeds; none: every step"
    )
    params: dict[str, Any] = Field(
        default_factory=dict, description="params that replace the parent job's"
    )
    reuse_upstream: bool = Field(
        default=True, description="reuse the parent's checkpoints of the steps not rerun"
    )
    only_failed_items: bool = Field(
        default=False, description="a for_each from_step runs only the items that failed"
    )
    priority: int | None = Field(
        default=None, ge=0, le=MAX_PRIORITY, description="default: the parent job's"
    )


class RoundPublic(BaseModel):
    round: int
    status: str
    attempts: int
    started_at: UtcDatetime | None
    finished_at: UtcDatetime | None
    error: dict[str, Any] | None


class StepPublic(BaseModel):
    step_id: str
    status: str
    attempts: int
    started_at: UtcDatetime | None
    finished_at: UtcDatetime | None
    error: dict[str, Any] | None
    shards: dict[str, int] | None
    round: int = Field(description="the loop round the step is in; 1 outside loops")
    rounds: list[RoundPublic] = Field(description="earlier rounds of a step in a loop")
    wake_at: UtcDatetime | None = Field(
        default=None,
        description=(
            "when a wait step (status sleeping) wakes, or woke; when a pipeline.run step "
            "retrying after a failed child starts its next attempt, its backoff over"
        ),
    )
    cached_from: dict[str, str] | None = Field(
        default=None,
        description="a cached step's source: the job_id and step_id whose output it took "
        "from the step cache instead of running",
    )

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
            round=step.round,
            rounds=[RoundPublic(**vars(r)) for r in step.rounds],
            wake_at=step.wake_at,
            cached_from=step.cached_from,
        )


class ParentPublic(BaseModel):
    job_id: uuid.UUID
    relation: Literal["rerun", "dependency", "child"] = Field(
        description=(
            "rerun: this job reruns it; dependency: its success started this job (a "
            "dependency trigger); child: its step step_id started this job (pipeline.run)"
        )
    )
    step_id: str | None = Field(description="the parent's step that started a child")

    @classmethod
    def of(cls, parent: Parent) -> "ParentPublic":
        return cls.model_validate(vars(parent))


class ChildPublic(BaseModel):
    id: uuid.UUID
    step_id: str = Field(description="the pipeline.run step that started it")
    attempt: int = Field(description="the attempt of that step; a retry starts a new child")
    pipeline: str
    status: str

    @classmethod
    def of(cls, child: Child) -> "ChildPublic":
        return cls(
            id=child.job_id,
            step_id=child.step_id,
            attempt=child.attempt,
            pipeline=child.pipeline,
            status=child.status,
        )


class JobPublic(BaseModel):
    id: uuid.UUID
    pipeline: str
    status: str
    params: dict[str, Any]
    labels: dict[str, str]
    trigger: str
    priority: int
    queue: str = Field(description="the queue of its first step, where fair share counts it")
    waiting_for: str | None = Field(
        description=(
            "what a queued job waits for before it is sent: concurrency (a free slot of its "
            "key) or turn (its owner's turn, with fair share on)"
        )
    )
    concurrency_key: str | None = Field(
        description="owner/pipeline/value of its pipeline's concurrency key, when it has one"
    )
    dedupe_key: str | None = Field(
        default=None,
        description="its pipeline's dedupe key resolved from its params, when it has one "
        "(sha256:<hex> for a value over 200 characters)",
    )
    parent_job_id: uuid.UUID | None = Field(
        description=(
            "the job a rerun reruns (trigger rerun) or whose success started it (trigger "
            "dependency); null on a child, whose parent is in parent"
        )
    )
    parent: ParentPublic | None = Field(
        default=None, description="the job this one came from, and how; null for none"
    )
    children: list[ChildPublic] = Field(
        default_factory=list,
        description="the jobs its pipeline.run steps started, oldest first, one per attempt",
    )
    pipeline_version: int | None
    schedule_id: uuid.UUID | None
    scheduled_for: UtcDatetime | None
    created_at: UtcDatetime
    started_at: UtcDatetime | None
    finished_at: UtcDatetime | None
    deadline_at: UtcDatetime | None = Field(
        description="past it, a job still open is failed as job_timeout (profile or schedule "
        "timeout_s); null when it has none"
    )
    result: Any
    error: dict[str, Any] | None
    diff_mode: bool
    item_count: int | None
    new_count: int | None
    removed_count: int | None
    steps: list[StepPublic]
    compensation: dict[str, Any] | None = Field(
        default=None,
        description="a saga's compensations: {status: running|completed|failed, steps: [...]}",
    )

    @classmethod
    def of(cls, view: JobView) -> "JobPublic":
        job = view.job
        return cls(
            id=job.id,
            pipeline=job.pipeline,
            status=job.status,
            params=job.params,
            labels=job.labels or {},
            trigger=job.trigger,
            priority=job.priority,
            queue=job.queue,
            waiting_for=job.waiting_for,
            concurrency_key=job.concurrency_key,
            dedupe_key=job.dedupe_key,
            parent_job_id=job.parent_job_id,
            parent=None if view.family.parent is None else ParentPublic.of(view.family.parent),
            children=[ChildPublic.of(child) for child in view.family.children],
            pipeline_version=job.pipeline_version,
            schedule_id=job.schedule_id,
            scheduled_for=job.scheduled_for,
            created_at=job.created_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            deadline_at=job.deadline_at,
            result=job.result,
            error=job.error,
            diff_mode=bool(job.diff_mode),
            item_count=job.item_count,
            new_count=job.new_count,
            removed_count=job.removed_count,
            compensation=view.compensation,
            steps=[StepPublic.of(step) for step in view.steps],
        )


class JobEnvelope(BaseModel):
    job: JobPublic


class JobSubmitted(JobEnvelope):
    deduplicated: bool = Field(
        default=False,
        description="true when the pipeline's dedupe key matched an open or recent job of the "
        "owner's: job is that job, and no new one was stored",
    )


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


class DecisionCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    comment: str | None = Field(default=None, max_length=2000)
    payload: Any = Field(
        default=None, description="what the step and its downstream read as approval.<step>"
    )


class ApprovalPublic(BaseModel):
    job_id: uuid.UUID
    pipeline: str
    step_id: str
    status: str
    on_timeout: str
    requested_at: UtcDatetime
    due_at: UtcDatetime
    escalated_at: UtcDatetime | None
    decided_at: UtcDatetime | None
    decided_by: str | None
    comment: str | None
    payload: Any

    @classmethod
    def of(cls, approval: ApprovalRow, pipeline: str) -> "ApprovalPublic":
        return cls(
            job_id=approval.job_id,
            pipeline=pipeline,
            step_id=approval.step_id,
            status=approval.status,
            on_timeout=approval.on_timeout,
            requested_at=approval.requested_at,
            due_at=approval.due_at,
            escalated_at=approval.escalated_at,
            decided_at=approval.decided_at,
            decided_by=approval.decided_by,
            comment=approval.comment,
            payload=approval.payload,
        )


class DecisionEnvelope(BaseModel):
    approval: ApprovalPublic
    job: JobPublic


class SignalCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    payload: Any = Field(
        default=None, description="what the waiting step and its downstream read as signals.<name>"
    )


class SignalPublic(BaseModel):
    job_id: uuid.UUID
    name: str
    payload: Any
    received_at: UtcDatetime
    sent_by: str | None
    resumed: list[str] = Field(description="the steps parked for it that it sent on")

    @classmethod
    def of(cls, signal: JobSignalRow, resumed: list[str]) -> "SignalPublic":
        return cls(
            job_id=signal.job_id,
            name=signal.name,
            payload=signal.payload,
            received_at=signal.received_at,
            sent_by=signal.sent_by,
            resumed=resumed,
        )


class SignalEnvelope(BaseModel):
    signal: SignalPublic
    job: JobPublic


class ApprovalList(BaseModel):
    approvals: list[ApprovalPublic]


class EventPublic(BaseModel):
    """One entry of a job's event log, as a stream sends it."""

    job_id: uuid.UUID
    seq: int = Field(description="the event's number within its job, in commit order")
    kind: str = Field(
        description=(
            "job.<status>, step.<status>, step.progress (fan-out), approval.<status>, "
            "compensation.<status>, or a notice (new_items, notified, notify_failed...)"
        )
    )
    step_id: str | None
    data: dict[str, Any]
    at: datetime


class LogLinePublic(BaseModel):
    """One line a step attempt logged or printed."""

    id: int = Field(description="the line's place in the job's log: the cursor (`after`)")
    step_id: str
    shard: int | None = Field(description="the fan-out item, none outside a fan-out")
    attempt: int
    round: int = Field(description="the loop round, 1 outside a loop")
    seq: int = Field(description="the line's number within its attempt")
    level: str = Field(description="DEBUG, INFO, WARNING, ERROR or CRITICAL")
    logger: str = Field(
        description="the logger's name; flowbeat.step for ctx.log, stdout or stderr for prints"
    )
    ts: UtcDatetime
    message: str

    @classmethod
    def of(cls, line: LogLine) -> "LogLinePublic":
        return cls(**line.public())


class LogPage(BaseModel):
    lines: list[LogLinePublic]
    next_after: int = Field(description="pass as `after` for the lines that follow these")
    more: bool = Field(description="whether this page was full, so more lines may follow now")

    @classmethod
    def of(cls, lines: list[LogLine], after: int, limit: int) -> "LogPage":
        return cls(
            lines=[LogLinePublic.of(line) for line in lines],
            next_after=lines[-1].id if lines else after,
            more=len(lines) == limit,
        )


class JobFilterBody(BaseModel):
    """The filter of ``GET /v1/jobs``, as a bulk action's body gives it."""

    model_config = ConfigDict(extra="forbid")

    pipeline: str | None = Field(default=None, max_length=64)
    status: list[str] = Field(default_factory=list, description="any of these statuses")
    labels: dict[str, str] = Field(
        default_factory=dict, description="every one of these labels (key: value)"
    )
    error_code: str | None = Field(
        default=None, max_length=64, description="jobs whose error has this code"
    )
    since: datetime | None = Field(default=None, description="created at or after (with a zone)")
    until: datetime | None = Field(default=None, description="created before (with a zone)")

    def match(self, statuses: list[str]) -> JobFilter:
        """``statuses``: ``status`` as the list route checks it."""
        return JobFilter(
            pipeline=self.pipeline,
            statuses=tuple(statuses),
            labels=check_labels(self.labels),
            error_code=self.error_code,
            since=self.since,
            until=self.until,
        )


class BulkCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    filter: JobFilterBody
    id: uuid.UUID | None = Field(
        default=None,
        description=(
            "the action's id: give your own to retry safely (a retry continues where the last "
            "try stopped); without one, a new action with a new id"
        ),
    )
    dry_run: bool = Field(
        default=False, description="change nothing: answer the count and the first ids"
    )


class BulkRerunCreate(BulkCreate):
    from_step: str | None = Field(
        default=None,
        description="the step each job reruns from; default: its failed step (its first step "
        "that did not succeed)",
    )
    priority: int | None = Field(
        default=None, ge=0, le=MAX_PRIORITY, description="default: each job's own"
    )


class BulkActionPublic(BaseModel):
    id: uuid.UUID
    kind: Literal["cancel", "rerun"]
    status: Literal["running", "done"] = Field(
        description="running: more batches to go (a retry of the same id goes on); done"
    )
    filter: dict[str, Any] = Field(
        description="the filter acted on: the one asked, limited to the statuses the action "
        "changes and to jobs created before it started"
    )
    matched: int = Field(description="jobs the filter matched when it started")
    acted: int = Field(description="jobs cancelled, or rerun, so far")
    skipped: int = Field(description="jobs that could not be changed when reached")
    created_at: UtcDatetime
    updated_at: UtcDatetime
    finished_at: UtcDatetime | None

    @classmethod
    def of(cls, row: BulkActionRow) -> "BulkActionPublic":
        return cls.model_validate(row, from_attributes=True)


class BulkResult(BaseModel):
    dry_run: bool
    count: int | None = Field(default=None, description="a dry run's count of matching jobs")
    job_ids: list[uuid.UUID] = Field(
        default_factory=list, description="a dry run's first matching jobs, oldest first"
    )
    bulk: BulkActionPublic | None = Field(default=None, description="the action, when not dry")
