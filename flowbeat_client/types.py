"""The API's objects as the client returns them: JSON, typed for the fields a caller reads."""

from typing import Any, TypedDict


class Step(TypedDict):
    step_id: str
    status: str
    attempts: int
    started_at: str | None
    finished_at: str | None
    error: dict[str, Any] | None
    shards: dict[str, int] | None
    round: int
    rounds: list[dict[str, Any]]
    cached_from: dict[str, str] | None
    """For a ``cached`` step, the ``job_id`` and ``step_id`` whose output it took."""


class Parent(TypedDict):
    job_id: str
    relation: str
    """rerun, dependency or child (a ``pipeline.run`` step of the parent started it)."""
    step_id: str | None


class Child(TypedDict):
    id: str
    step_id: str
    attempt: int
    pipeline: str
    status: str


class Job(TypedDict):
    id: str
    pipeline: str
    status: str
    params: dict[str, Any]
    trigger: str
    parent_job_id: str | None
    parent: Parent | None
    children: list[Child]
    pipeline_version: int | None
    schedule_id: str | None
    scheduled_for: str | None
    created_at: str
    started_at: str | None
    finished_at: str | None
    deadline_at: str | None
    result: Any
    error: dict[str, Any] | None
    diff_mode: bool
    item_count: int | None
    new_count: int | None
    removed_count: int | None
    steps: list[Step]
    compensation: dict[str, Any] | None


class Submitted(TypedDict):
    job: Job
    deduplicated: bool
    """The pipeline's dedupe key matched an open or recent job of the owner's: ``job`` is that
    job, and no new one was stored."""


class JobPage(TypedDict):
    jobs: list[Job]
    next_cursor: str | None


class Pipeline(TypedDict):
    name: str
    owner: str
    description: str
    tags: list[str]
    shared_with: list[str]
    version: int | None
    content_hash: str
    read_only: bool
    run_count: int
    created_at: str | None
    updated_at: str | None


class PipelineDetail(Pipeline):
    profile: dict[str, Any]


class Schedule(TypedDict):
    id: str
    name: str | None
    pipeline: str
    owner: str
    priority: int | None
    cron: str | None
    every_s: int | None
    timezone: str
    params: dict[str, Any]
    enabled: bool
    overlap: str
    catchup: str
    catchup_window_s: int
    jitter_s: int
    diff_mode: bool
    notify_url: str | None
    next_fire_at: str | None
    last_fire_at: str | None
    last_job_id: str | None
    last_status: str | None
    run_count: int
    created_at: str
    updated_at: str


class Backfill(TypedDict):
    id: str
    schedule_id: str
    pipeline: str
    owner: str
    range_from: str
    range_to: str
    cron: str
    timezone: str
    max_active: int
    status: str
    """``running``, ``completed`` or ``cancelled``."""
    total: int
    started: int
    skipped: int
    pending: int
    open: int
    jobs: dict[str, int]
    cursor: str | None
    created_by: str
    created_at: str
    finished_at: str | None


class Run(TypedDict):
    job_id: str
    trigger: str
    status: str
    created_at: str
    started_at: str | None
    finished_at: str | None
    item_count: int | None
    new_count: int | None
    removed_count: int | None
    no_new_items: bool


class RunPage(TypedDict):
    runs: list[Run]
    next_cursor: str | None


class Diff(TypedDict):
    job_id: str
    previous_job_id: str | None
    kind: str
    counts: dict[str, int]
    items: list[Any]
    next_cursor: str | None


class LogLine(TypedDict):
    id: int
    step_id: str
    shard: int | None
    attempt: int
    round: int
    seq: int
    level: str
    logger: str
    ts: str
    message: str


class LogPage(TypedDict):
    lines: list[LogLine]
    next_after: int
    more: bool
