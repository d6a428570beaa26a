"""SQLAlchemy rows. Constraint names follow one convention so Alembic output is deterministic."""

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {dict[str, Any]: JSONB, datetime: DateTime(timezone=True)}


class ApiKeyRow(Base):
    __tablename__ = "api_keys"

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True, default=uuid.uuid4)
    owner: Mapped[str] = mapped_column(String(128))
    prefix: Mapped[str] = mapped_column(String(16), unique=True)
    secret_hash: Mapped[str] = mapped_column(String(64))
    scopes: Mapped[list[str]] = mapped_column(ARRAY(String(16)))
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    revoked_at: Mapped[datetime | None]


class JobRow(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("owner", "idempotency_key"),
        Index(None, "pipeline", "created_at"),
        Index(None, "status", "created_at"),
        Index(None, "created_at", "id"),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True, default=uuid.uuid4)
    owner: Mapped[str] = mapped_column(String(128))
    pipeline: Mapped[str] = mapped_column(String(64))
    profile: Mapped[dict[str, Any]]
    profile_hash: Mapped[str] = mapped_column(String(64))
    params: Mapped[dict[str, Any]]
    status: Mapped[str] = mapped_column(String(24))
    trigger: Mapped[str] = mapped_column(String(24))
    parent_job_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="SET NULL")
    )
    idempotency_key: Mapped[str | None] = mapped_column(String(256))
    request_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    dispatched_at: Mapped[datetime | None]
    result: Mapped[Any] = mapped_column(JSONB, nullable=True)
    error: Mapped[dict[str, Any] | None]
    item_count: Mapped[int | None] = mapped_column(Integer)
    new_count: Mapped[int | None] = mapped_column(Integer)
    removed_count: Mapped[int | None] = mapped_column(Integer)
    previous_job_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="SET NULL")
    )
    diff_mode: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    notify_url: Mapped[str | None] = mapped_column(Text)
    pipeline_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("pipelines.id", ondelete="SET NULL"), index=True
    )
    pipeline_version: Mapped[int | None] = mapped_column(Integer)
    schedule_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("schedules.id", ondelete="SET NULL"), index=True
    )
    scheduled_for: Mapped[datetime | None]


OPEN_SHARD_PREDICATE = "shard >= 0 AND status IN ('pending', 'retrying', 'running')"


class StepRunRow(Base):
    """One step of a job, or one shard of a fan-out step (``shard`` >= 0).

    ``ix_step_runs_open_shards`` holds only shards still to run, so a lane finds the next one
    without walking past every finished shard of a fan-out thousands of items wide.
    """

    __tablename__ = "step_runs"
    __table_args__ = (
        UniqueConstraint("job_id", "step_id", "shard"),
        Index(None, "status", "lease_until"),
        Index(
            "ix_step_runs_open_shards",
            "job_id",
            "step_id",
            "shard",
            postgresql_where=text(OPEN_SHARD_PREDICATE),
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="CASCADE")
    )
    step_id: Mapped[str] = mapped_column(String(64))
    shard: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(24))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    lease_token: Mapped[str | None] = mapped_column(String(64))
    lease_until: Mapped[datetime | None]
    task_id: Mapped[str | None] = mapped_column(String(64))
    item: Mapped[Any] = mapped_column(JSONB, nullable=True)
    depends_on: Mapped[list[str]] = mapped_column(ARRAY(String(64)), default=list)
    inputs_from: Mapped[list[str]] = mapped_column(ARRAY(String(64)), default=list)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    error: Mapped[dict[str, Any] | None]


class CheckpointRow(Base):
    """A step's output, written once: the primary key refuses a second copy."""

    __tablename__ = "step_checkpoints"

    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    step_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    shard: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer)
    output: Mapped[Any] = mapped_column(JSONB)
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())


class ResultItemRow(Base):
    """One result item of a succeeded job, keyed by its key field, so runs diff in SQL."""

    __tablename__ = "result_items"

    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    item_key: Mapped[str] = mapped_column(Text, primary_key=True)
    item: Mapped[Any] = mapped_column(JSONB)


class JobEventRow(Base):
    """Something a job's owner may be told about: new items found, a notice sent or given up."""

    __tablename__ = "job_events"
    __table_args__ = (Index(None, "job_id", "id"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="CASCADE")
    )
    kind: Mapped[str] = mapped_column(String(32))
    data: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())


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
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())


class ScheduleRow(Base):
    """When a pipeline runs on its own. ``next_fire_at`` is the next nominal fire time."""

    __tablename__ = "schedules"
    __table_args__ = (
        UniqueConstraint("owner", "pipeline"),
        Index(None, "enabled", "next_fire_at"),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True, default=uuid.uuid4)
    owner: Mapped[str] = mapped_column(String(128))
    pipeline: Mapped[str] = mapped_column(String(64))
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
    next_fire_at: Mapped[datetime | None]
    buffered_fire_at: Mapped[datetime | None]
    last_fire_at: Mapped[datetime | None]
    last_job_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())


class ScheduleFireRow(Base):
    """One row per (schedule, fire time): the fence that refuses a second job for a fire,
    whichever scheduler replica tries. ``job_id`` is null for a fire skipped by policy."""

    __tablename__ = "schedule_fires"
    __table_args__ = (UniqueConstraint("schedule_id", "fire_at"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    schedule_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("schedules.id", ondelete="CASCADE")
    )
    fire_at: Mapped[datetime]
    job_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="SET NULL")
    )
    outcome: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
