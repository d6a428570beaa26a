"""The rows of what starts jobs: saved pipelines and their versions, schedules and their fires,
hooks and their deliveries, and dependency triggers; apart from the engine's rows, which change
with the engine's SQL."""

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    ForeignKey,
    Index,
    Integer,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.orm import Mapped, mapped_column

from service.platform.models.base import Base


class PipelineRow(Base):
    """A saved pipeline of one owner; its content lives in ``pipeline_versions``."""

    __tablename__ = "pipelines"
    __table_args__ = (UniqueConstraint("owner", "name"),)

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True, default=uuid.uuid4)
    owner: Mapped[str] = mapped_column(String(128))
    name: Mapped[str] = mapped_column(String(64))
    description: Mapped[str] = mapped_column(Text, default="")
    tags: Mapped[list[str]] = mapped_column(ARRAY(String(64)), default=list)
    shared_with: Mapped[list[str]] = mapped_column(ARRAY(String(128)), default=list)
    current_version: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())


class PipelineVersionRow(Base):
    """One saved content of a pipeline; a content hash is stored once per pipeline."""

    __tablename__ = "pipeline_versions"
    __table_args__ = (UniqueConstraint("pipeline_id", "content_hash"),)

    pipeline_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("pipelines.id", ondelete="CASCADE"), primary_key=True
    )
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    content_hash: Mapped[str] = mapped_column(String(64))
    profile: Mapped[dict[str, Any]]
    source: Mapped[str | None] = mapped_column(Text)
    """The text the version was saved from (YAML or JSON, comments and all), when it was saved
    from text within ``FLOWBEAT_MAX_BODY_BYTES``; null for versions saved before it was kept."""
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())


class ScheduleRow(Base):
    """When a pipeline runs on its own. ``next_fire_at`` is the next nominal fire time.

    A pipeline may have several (a daily and a monthly run with their own params); ``name``
    tells them apart for people and is unique per owner and pipeline when set, while unnamed
    ones are told apart by ``id`` (PostgreSQL treats nulls as distinct in the constraint).
    """

    __tablename__ = "schedules"
    __table_args__ = (
        UniqueConstraint("owner", "pipeline", "name"),
        CheckConstraint("priority BETWEEN 0 AND 9", name="priority"),
        Index(None, "enabled", "next_fire_at"),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True, default=uuid.uuid4)
    owner: Mapped[str] = mapped_column(String(128))
    pipeline: Mapped[str] = mapped_column(String(64))
    name: Mapped[str | None] = mapped_column(String(64))
    priority: Mapped[int | None] = mapped_column(SmallInteger)
    """The priority its jobs are submitted with; null takes the profile's default."""
    labels: Mapped[dict[str, Any]] = mapped_column(server_default=text("'{}'::jsonb"))
    """Labels of the jobs it starts, over the profile's; values may read its params."""
    cron: Mapped[str | None] = mapped_column(String(200))
    every_s: Mapped[int | None] = mapped_column(Integer)
    timezone: Mapped[str] = mapped_column(String(64))
    params: Mapped[dict[str, Any]]
    enabled: Mapped[bool] = mapped_column(Boolean)
    overlap: Mapped[str] = mapped_column(String(24))
    catchup: Mapped[str] = mapped_column(String(16))
    catchup_window_s: Mapped[int] = mapped_column(Integer)
    jitter_s: Mapped[int] = mapped_column(Integer)
    diff_mode: Mapped[bool] = mapped_column(Boolean)
    notify_url: Mapped[str | None] = mapped_column(Text)
    timeout_s: Mapped[int | None] = mapped_column(Integer)
    """The deadline of the jobs it fires; ``None`` leaves the profile's."""
    next_fire_at: Mapped[datetime | None]
    buffered_fire_at: Mapped[datetime | None]
    last_fire_at: Mapped[datetime | None]
    last_job_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    run_count: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    """Runs this schedule created; its fire records are pruned, the count is not."""
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())


JOB_NAMED = text("job_id IS NOT NULL")
"""The predicate of the index of a row's ``job_id`` that a pruned job's ``SET NULL`` finds it
by: without one, deleting a job read the whole table (migration 0057)."""


class ScheduleFireRow(Base):
    """One row per (schedule, fire time): the fence that refuses a second job for a fire,
    whichever scheduler replica tries. ``job_id`` is null for a fire skipped by policy."""

    __tablename__ = "schedule_fires"
    __table_args__ = (
        UniqueConstraint("schedule_id", "fire_at"),
        Index(None, "job_id", postgresql_where=JOB_NAMED),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    schedule_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("schedules.id", ondelete="CASCADE")
    )
    fire_at: Mapped[datetime]
    job_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="SET NULL")
    )
    outcome: Mapped[str] = mapped_column(String(16))
    backfill_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("backfills.id", ondelete="CASCADE"), index=True
    )
    """The backfill that took this fire; its records stay as long as the backfill does, since
    a backfill's fires are older than any retention of ordinary fire records."""
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())


class BackfillRow(Base):
    """One backfill of a schedule: its fires in ``[range_from, range_to)``, started oldest
    first, at most ``max_active`` open at once. ``cursor`` is the last fire handed out, moved
    in the transaction that fences that fire, so whichever scheduler replica tops it up next
    goes on from there without skipping or repeating a fire."""

    __tablename__ = "backfills"
    __table_args__ = (
        CheckConstraint("max_active >= 1", name="max_active"),
        CheckConstraint("range_from < range_to", name="range"),
        Index(None, "status"),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True, default=uuid.uuid4)
    schedule_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("schedules.id", ondelete="CASCADE"), index=True
    )
    owner: Mapped[str] = mapped_column(String(128))
    pipeline: Mapped[str] = mapped_column(String(64))
    range_from: Mapped[datetime]
    range_to: Mapped[datetime]
    cron: Mapped[str] = mapped_column(String(200))
    timezone: Mapped[str] = mapped_column(String(64))
    """The schedule's timing when the backfill was made: a later change of the schedule does
    not change which fires its range covers."""
    max_active: Mapped[int] = mapped_column(Integer)
    total: Mapped[int] = mapped_column(Integer)
    """Fire times in the range, counted when it was created."""
    cursor: Mapped[datetime | None]
    skipped: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    """Fires in the range that had run already: counted, never started again."""
    status: Mapped[str] = mapped_column(String(16))
    created_by: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    finished_at: Mapped[datetime | None]


class HookRow(Base):
    """A webhook: deliveries signed with ``secret`` start jobs of ``pipeline`` as ``owner``,
    with params mapped from the delivery's body. The secret is kept to check signatures with,
    and shown only when it is set."""

    __tablename__ = "hooks"
    __table_args__ = (UniqueConstraint("name"),)

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True, default=uuid.uuid4)
    name: Mapped[str] = mapped_column(String(64))
    owner: Mapped[str] = mapped_column(String(128))
    pipeline: Mapped[str] = mapped_column(String(200))
    params: Mapped[dict[str, Any]]
    secret: Mapped[str] = mapped_column(String(128))
    labels: Mapped[dict[str, Any]] = mapped_column(server_default=text("'{}'::jsonb"))
    """Labels of the jobs it starts, over the profile's; values may read the job's params."""
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())


class HookDeliveryRow(Base):
    """A delivery a hook accepted: its id fences a replay, which gets the first job back, and
    its signature's digest fences the signed message itself."""

    __tablename__ = "hook_deliveries"
    __table_args__ = (
        Index(None, "received_at"),
        Index(None, "hook_id", "signature", unique=True),
        Index(None, "job_id", postgresql_where=JOB_NAMED),
    )

    hook_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("hooks.id", ondelete="CASCADE"), primary_key=True
    )
    delivery_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    signature: Mapped[str | None] = mapped_column(String(64))
    """The hex HMAC digest; null on deliveries accepted before it was signed (migration 0016)."""
    job_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="SET NULL")
    )
    received_at: Mapped[datetime] = mapped_column(server_default=func.now())


class PipelineTriggerRow(Base):
    """``downstream`` (a saved pipeline of ``owner``) starts when ``owner``'s job of
    ``upstream`` succeeds (``kind`` succeeded) or succeeds with new items (``kind`` new_items):
    the ``on`` of its current version."""

    __tablename__ = "pipeline_triggers"

    owner: Mapped[str] = mapped_column(String(128), primary_key=True)
    upstream: Mapped[str] = mapped_column(String(64), primary_key=True)
    downstream: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), server_default="succeeded")


class DependencyQueueRow(Base):
    """A success some pipeline waits for, queued by a trigger with the success itself and
    drained oldest first."""

    __tablename__ = "dependency_queue"
    __table_args__ = (Index(None, "queued_at"),)

    upstream_job_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    queued_at: Mapped[datetime] = mapped_column(server_default=func.now())


class DependencyFireRow(Base):
    """The fence: one downstream job per (upstream job, downstream pipeline)."""

    __tablename__ = "dependency_fires"
    __table_args__ = (Index(None, "job_id", postgresql_where=JOB_NAMED),)

    upstream_job_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    downstream: Mapped[str] = mapped_column(String(64), primary_key=True)
    job_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="SET NULL")
    )
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
