"""The rows a job writes as it runs: jobs, step runs and their checkpoints, result items,
events, loop rounds, compensations, approvals and what a pruned job leaves. They stand apart
from the catalogue's because the engine's hand-written SQL names their columns and changes
with them."""

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
    false,
    func,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.orm import Mapped, column_property, mapped_column

from service.platform.models.base import Base
from service.platform.states import JOB_OPEN_SQL, STEP_FINAL, StepStatus, sql_in

OPEN_DEADLINE = f"deadline_at IS NOT NULL AND status IN {JOB_OPEN_SQL}"
"""The jobs a deadline may still end: ``ix_jobs_open_deadline`` holds only these, so the
beat's check reads the few open jobs with a deadline, not every job ever run."""


KEYED = "idempotency_key IS NOT NULL"
"""Only jobs sent with an idempotency key are in its unique index (migration 0048): no update
of ``jobs`` is HOT, so a full index took an entry at each of a keyless job's three writes. An
``ON CONFLICT`` on the key names this predicate for PostgreSQL to infer the index."""
LABEL_OPS = "jsonb_path_ops"
"""``ix_jobs_labels`` answers only containment (``labels @> '{"tenant": "acme"}'``), the one
question a label filter asks, in an index about a third the size of the default GIN's."""
STEP_ORDER = "nextval('step_runs_id_seq'::regclass)"
NO_LABELS = "'{}'::jsonb"
"""``ix_jobs_labels`` holds only jobs with labels: a GIN index writes an entry for an empty
document too, at a job's insert and at each status change (none is HOT), 170 WAL bytes a step
of a chain whose jobs carry no labels (migration 0043)."""


class JobProfileRow(Base):
    """A profile that jobs ran, stored once by its content hash (ADR 22): a job's row names it
    by ``profile_hash``. Every job of a pipeline's version carried the same snapshot in its own
    row, which PostgreSQL does not compress below 2 kB, and into the WAL at each insert. No
    foreign key: its check would lock this row at each job's insert. The statements that store
    jobs write it; retention deletes it once no job has named it for a day."""

    __tablename__ = "job_profiles"

    hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    profile: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())


class JobRow(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        Index(
            "uq_jobs_owner_idempotency_key",
            "owner",
            "idempotency_key",
            unique=True,
            postgresql_where=text(KEYED),
        ),
        Index(
            "ix_jobs_pipeline_id", "pipeline_id", postgresql_where=text("pipeline_id IS NOT NULL")
        ),
        CheckConstraint("priority BETWEEN 0 AND 9", name="priority"),
        Index(None, "pipeline", "created_at"),
        Index(None, "status", "created_at"),
        Index(None, "created_at", "id"),
        Index(None, "owner", "pipeline", "created_at", "id"),
        Index(
            "ix_jobs_finished_at", "finished_at", postgresql_where=text("finished_at IS NOT NULL")
        ),
        Index(
            "ix_jobs_previous_job_id",
            "previous_job_id",
            postgresql_where=text("previous_job_id IS NOT NULL"),
        ),
        Index(
            "ix_jobs_parent_job_id",
            "parent_job_id",
            postgresql_where=text("parent_job_id IS NOT NULL"),
        ),
        Index(
            "ix_jobs_open_by_owner",
            "owner",
            postgresql_where=text(f"status IN {JOB_OPEN_SQL}"),
        ),
        Index(
            "ix_jobs_sent_unstarted",
            "queue",
            "created_at",
            postgresql_where=text(
                "status = 'queued' AND waiting_for IS NULL AND dispatched_at IS NOT NULL"
            ),
        ),
        Index(
            "ix_jobs_waiting_turn",
            "queue",
            "owner",
            text("priority DESC"),
            "created_at",
            "id",
            postgresql_where=text("status = 'queued' AND waiting_for = 'turn'"),
        ),
        Index(
            "ix_jobs_slot_holders",
            "concurrency_key",
            postgresql_where=text(
                f"concurrency_key IS NOT NULL AND waiting_for IS NULL AND status IN {JOB_OPEN_SQL}"
            ),
        ),
        Index(
            "ix_jobs_slot_waiting",
            "concurrency_key",
            text("priority DESC"),
            "created_at",
            "id",
            postgresql_where=text("waiting_for = 'concurrency' AND status = 'queued'"),
        ),
        Index("ix_jobs_open_deadline", "deadline_at", postgresql_where=text(OPEN_DEADLINE)),
        Index(
            "ix_jobs_notice_due_at",
            "notice_due_at",
            postgresql_where=text("notice_due_at IS NOT NULL"),
        ),
        Index(
            "ix_jobs_schedule_id", "schedule_id", postgresql_where=text("schedule_id IS NOT NULL")
        ),
        Index(
            "ix_jobs_labels",
            "labels",
            postgresql_using="gin",
            postgresql_ops={"labels": LABEL_OPS},
            postgresql_where=text(f"labels <> {NO_LABELS}"),
        ),
        Index(
            "ix_jobs_dedupe",
            "owner",
            "pipeline",
            "dedupe_key",
            text("finished_at DESC"),
            postgresql_where=text("dedupe_key IS NOT NULL"),
        ),
        Index(
            "ix_jobs_error_code",
            text("(error ->> 'code')"),
            "created_at",
            postgresql_where=text("error IS NOT NULL"),
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True, default=uuid.uuid4)
    owner: Mapped[str] = mapped_column(String(128))
    pipeline: Mapped[str] = mapped_column(String(64))
    profile_hash: Mapped[str] = mapped_column(String(64))
    params: Mapped[dict[str, Any]]
    status: Mapped[str] = mapped_column(String(24))
    trigger: Mapped[str] = mapped_column(String(24))
    priority: Mapped[int] = mapped_column(SmallInteger, server_default="0")
    queue: Mapped[str] = mapped_column(String(40), server_default="default")
    """Where its first step waits: fair share counts and takes turns queue by queue."""
    parent_job_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="SET NULL")
    )
    idempotency_key: Mapped[str | None] = mapped_column(String(256))
    request_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    dispatched_at: Mapped[datetime | None]
    concurrency_key: Mapped[str | None] = mapped_column(Text)
    """Its pipeline's ``concurrency`` key, resolved from its params, with owner and pipeline."""
    concurrency_limit: Mapped[int | None]
    dedupe_key: Mapped[str | None] = mapped_column(Text)
    """Its pipeline's ``dedupe`` key, resolved from its params: ``ix_jobs_dedupe`` finds the
    key's open job, else its newest ended one, in two short range reads
    (``flowbeat_dedupe_twin``)."""
    waiting_for: Mapped[str | None] = mapped_column(String(24))
    """What a queued job waits for before any of it is sent: ``concurrency``, a free slot of
    its key, or ``turn``, its owner's turn while enough jobs are sent ahead (fair share)."""
    result: Mapped[Any] = mapped_column(JSONB, nullable=True)
    error: Mapped[dict[str, Any] | None]
    item_count: Mapped[int | None] = mapped_column(Integer)
    new_count: Mapped[int | None] = mapped_column(Integer)
    removed_count: Mapped[int | None] = mapped_column(Integer)
    previous_job_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="SET NULL")
    )
    diff_mode: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    refresh: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """Submitted with ``refresh``: its cache-declaring steps run their actions again instead of
    taking an output from the step cache, and what they return is cached anew."""
    notify_url: Mapped[str | None] = mapped_column(Text)
    notice_due_at: Mapped[datetime | None]
    """Since when its notice of new items (or the last resend of it) waits for an outcome,
    delivered or given up: the sweeper finds a notice whose task was lost through
    ``ix_jobs_notice_due_at``, which holds waiting notices only, however long the history."""
    pipeline_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("pipelines.id", ondelete="SET NULL")
    )
    pipeline_version: Mapped[int | None] = mapped_column(Integer)
    schedule_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("schedules.id", ondelete="SET NULL")
    )
    scheduled_for: Mapped[datetime | None]
    trigger_data: Mapped[dict[str, Any] | None]
    """For a job a dependency trigger started: the upstream ``job_id`` and ``result``."""
    traceparent: Mapped[str | None] = mapped_column(String(55))
    """The trace it was submitted in (tracing on only): messages sent for it from outside its
    steps (the beat, the sweeper, a decision) carry it on."""
    labels: Mapped[dict[str, Any]] = mapped_column(server_default=text("'{}'::jsonb"))
    """String keys and values that say whom or what the job is for (``tenant: acme``); the
    list and the bulk actions find jobs by them through ``ix_jobs_labels``."""
    deadline_at: Mapped[datetime | None]
    """When the beat leader fails the job as ``job_timeout`` if it is still open: its
    submission plus the ``timeout_s`` of its schedule or, failing that, of its profile."""
    logged_inline: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """Flipped by a statement that logs its change of the row itself, so that the log's
    triggers skip that change (``service.engine.inline_events``)."""
    profile: Mapped[dict[str, Any]] = column_property(
        select(JobProfileRow.profile)
        .where(JobProfileRow.hash == profile_hash)
        .correlate_except(JobProfileRow)
        .scalar_subquery()
    )
    """The profile it runs, read from ``job_profiles`` with the row, as the column it was
    (ADR 22): a row read in one session is used after it closes. The engine's own statements
    read it by hash, once a process (``service.language.snapshots``)."""


class PrunedJobRow(Base):
    """What is left of a job retention deleted, so that a client polling it learns it expired
    (410) rather than that it never existed (404); pruned itself after a while."""

    __tablename__ = "pruned_jobs"

    job_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    owner: Mapped[str] = mapped_column(String(128))
    pipeline: Mapped[str] = mapped_column(String(64))
    finished_at: Mapped[datetime | None]
    pruned_at: Mapped[datetime] = mapped_column(index=True)


_OPEN_SHARD = sql_in((StepStatus.PENDING, StepStatus.RETRYING, StepStatus.RUNNING))
OPEN_SHARD_PREDICATE = f"shard >= 0 AND status IN {_OPEN_SHARD}"
SLEEPING_PREDICATE = f"status = '{StepStatus.SLEEPING}'"
OPEN_STEP_SQL = sql_in(tuple(s for s in StepStatus if s not in STEP_FINAL))
"""``ix_step_runs_status_lease_until`` holds open steps only: what the sweeper and the metrics
read by status, and not a settled step's last write."""


class StepRunRow(Base):
    """One step of a job, or one shard of a fan-out step (``shard`` >= 0).

    ``ix_step_runs_open_shards`` holds only shards still to run, so a lane finds the next one
    without walking past every finished shard of a fan-out thousands of items wide.

    ``waiting_on`` counts the upstream steps not yet settled. Each upstream step takes one off
    as it settles, under the row lock of the UPDATE, so exactly one of several parents that
    settle at once sees it reach zero and sends the step: no parent misses it, none sends twice.

    No foreign key to ``jobs``: its check ran a statement and locked the job's row for every
    step row the intake inserts, which inserts a job's steps in the statement that inserts the
    job. A trigger deletes a deleted job's steps (migration 0043).
    The primary key is the step's own (job, step, shard), not a number: a step row is updated
    twice and no update can be HOT, so each index of the table takes three entries a step.
    """

    __tablename__ = "step_runs"
    __table_args__ = (
        Index(
            "ix_step_runs_status_lease_until",
            "status",
            "lease_until",
            postgresql_where=text(f"status IN {OPEN_STEP_SQL}"),
        ),
        Index(
            "ix_step_runs_open_shards",
            "job_id",
            "step_id",
            "shard",
            postgresql_where=text(OPEN_SHARD_PREDICATE),
        ),
        Index(
            "ix_step_runs_slots",
            "slot_key",
            "status",
            postgresql_where=text(
                "slot_key IS NOT NULL AND status IN ('running', 'pending', 'awaiting_slot')"
            ),
        ),
        Index("ix_step_runs_wake_at", "wake_at", postgresql_where=text(SLEEPING_PREDICATE)),
    )

    job_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    step_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    shard: Mapped[int] = mapped_column(Integer, primary_key=True)
    id: Mapped[int] = mapped_column(BigInteger, server_default=text(STEP_ORDER))
    """The order the intake inserted a job's steps in, which is the profile's: no index holds
    it, since a job's steps are read by the primary key and sorted by it."""
    status: Mapped[str] = mapped_column(String(24))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    lease_token: Mapped[str | None] = mapped_column(String(64))
    lease_until: Mapped[datetime | None]
    task_id: Mapped[str | None] = mapped_column(String(64))
    item: Mapped[Any] = mapped_column(JSONB, nullable=True)
    depends_on: Mapped[list[str]] = mapped_column(ARRAY(String(64)), default=list)
    inputs_from: Mapped[list[str]] = mapped_column(ARRAY(String(64)), default=list)
    waiting_on: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    round: Mapped[int] = mapped_column(Integer, default=1, server_default=text("1"))
    wake_at: Mapped[datetime | None]
    """When a sleeping ``wait`` step is due to wake; the beat leader finds it through
    ``ix_step_runs_wake_at``, which holds sleeping rows only."""
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    error: Mapped[dict[str, Any] | None]
    slot_key: Mapped[str | None] = mapped_column(Text)
    """A step with a concurrency key: the key's value, once it asked for a slot."""
    slot_limit: Mapped[int | None]
    slot_asked_at: Mapped[datetime | None]
    slot_reserved: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """Let in by the beat: its next claim takes the slot kept for it."""
    logged_inline: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """As ``JobRow.logged_inline``."""
    output: Mapped[Any] = mapped_column(JSONB, nullable=True, deferred=True)
    """The step's checkpoint, written once by the update that settles it under its lease
    (``service.engine.checkpoints``); ``NULL`` until then, and JSON ``null`` for an output of
    ``None``. Deferred: a job's step rows are read often, their outputs seldom (ADR 28)."""


class ResultItemRow(Base):
    """One result item of a succeeded job, keyed by its key field, so runs diff in SQL."""

    __tablename__ = "result_items"

    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    item_key: Mapped[str] = mapped_column(Text, primary_key=True)
    item: Mapped[Any] = mapped_column(JSONB)


class JobEventRow(Base):
    """One entry of a job's event log: a state change, fan-out progress, new items, a notice.

    State changes are written by the triggers of migration 0011 (each a single statement since
    0041), which also number every event (``seq``, per job, in commit order) when its
    transaction commits; code that appends an event itself leaves ``seq`` empty for them. The
    step path's statements log their own changes, all of a statement's in one row (``more``).
    No foreign key: the migration says why, and a trigger deletes a job's log with the job.
    """

    __tablename__ = "job_events"
    __table_args__ = (UniqueConstraint("job_id", "seq"), Index(None, "created_at"))

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    job_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    seq: Mapped[int | None] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(32))
    step_id: Mapped[str | None] = mapped_column(String(64))
    data: Mapped[dict[str, Any]]
    more: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONB)
    """The events its statement logged before the one in its own columns, each a ``kind``,
    ``step_id`` and ``data``, numbered up to its ``seq`` (ADR 20): one row and three index
    entries for a claim that starts its job, or a checkpoint that claims the next step."""
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())


class JobEventSeqRow(Base):
    """The last event number of a job, locked by each committing transaction that adds one."""

    __tablename__ = "job_event_seqs"

    job_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer)


class EventListenerRow(Base):
    """A connection that listens for the event log's notifications, by its backend's pid.

    The step path's statements notify only while a row is here (ADR 19): a notifying commit
    holds a lock for the whole database until its flush, so notifying commits share none.
    Unlogged: a crash empties it, and ends the listeners' connections with it, which register
    again as they reconnect."""

    __tablename__ = "event_listeners"
    __table_args__ = {"prefixes": ["UNLOGGED"]}

    pid: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    since: Mapped[datetime] = mapped_column(server_default=func.now())


class StepRoundRow(Base):
    """A finished round of a step in a loop, kept when the next round starts over its row."""

    __tablename__ = "step_rounds"

    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    step_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    round: Mapped[int] = mapped_column(Integer, primary_key=True)
    status: Mapped[str] = mapped_column(String(24))
    attempts: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    error: Mapped[dict[str, Any] | None]
    output: Mapped[Any] = mapped_column(JSONB, nullable=True)


class StepLogRow(Base):
    """One line a step attempt logged or printed. An attempt's lines are written together in
    one statement once it has run (``service.engine.steplogs``); ``id`` orders them across
    attempts and shards and is the cursor a reader pages and follows by."""

    __tablename__ = "step_logs"
    __table_args__ = (Index(None, "job_id", "step_id", "id"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="CASCADE")
    )
    step_id: Mapped[str] = mapped_column(String(64))
    shard: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer)
    round: Mapped[int] = mapped_column(Integer)
    seq: Mapped[int] = mapped_column(Integer)
    level: Mapped[str] = mapped_column(String(16))
    logger: Mapped[str] = mapped_column(Text)
    ts: Mapped[datetime]
    message: Mapped[str] = mapped_column(Text)


class CompensationRow(Base):
    """The undoing of one succeeded step of a failed or cancelled job. ``seq`` orders them by
    reverse completion; only the first unfinished one may run, so they run one at a time."""

    __tablename__ = "compensations"
    __table_args__ = (Index(None, "status", "due_at"),)

    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    step_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(24))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    lease_token: Mapped[str | None] = mapped_column(String(64))
    lease_until: Mapped[datetime | None]
    due_at: Mapped[datetime]
    """When it became ready to run (again): the sweeper re-sends one left pending past it."""
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    error: Mapped[dict[str, Any] | None]


class ApprovalRow(Base):
    """The decision on a gated step of a job: asked for when the job reached it, then given by
    a person, or by the elected beat replica when it times out."""

    __tablename__ = "approvals"
    __table_args__ = (Index(None, "status", "due_at"),)

    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    step_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    status: Mapped[str] = mapped_column(String(24))
    on_timeout: Mapped[str] = mapped_column(String(24))
    requested_at: Mapped[datetime]
    due_at: Mapped[datetime]
    escalated_at: Mapped[datetime | None]
    decided_at: Mapped[datetime | None]
    decided_by: Mapped[str | None] = mapped_column(String(128))
    comment: Mapped[str | None] = mapped_column(Text)
    payload: Mapped[Any] = mapped_column(JSONB, nullable=True)


class JobSignalRow(Base):
    """A signal sent to a job (``POST /v1/jobs/{id}/signals/{name}``): kept once per name, so one
    that arrives before its step waits is there when it does, and a second one is refused."""

    __tablename__ = "job_signals"

    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    payload: Mapped[Any] = mapped_column(JSONB, nullable=True)
    received_at: Mapped[datetime]
    sent_by: Mapped[str | None] = mapped_column(String(128))


class SignalWaitRow(Base):
    """A step parked for a signal: when it began to wait, when its ``timeout_s`` runs out and
    what then; ``timed_out_at`` marks a wait that ran out and went on (``on_timeout:
    continue``), so its step runs reading ``null`` rather than parking again."""

    __tablename__ = "signal_waits"
    __table_args__ = (Index(None, "due_at", postgresql_where=text("timed_out_at IS NULL")),)

    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    step_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    signal: Mapped[str] = mapped_column(String(64))
    on_timeout: Mapped[str] = mapped_column(String(16))
    waiting_since: Mapped[datetime]
    due_at: Mapped[datetime]
    timed_out_at: Mapped[datetime | None]


class RateWaitRow(Base):
    """A step parked for its rate-limit key (``awaiting_rate``): the key's resolved value and
    its limit, the units the step takes, when it parked (its place in the key's line) and when
    the window is next due to have room for it. Kept in PostgreSQL, so a Redis flush, which
    loses the windows, loses no waiting step."""

    __tablename__ = "rate_waits"
    __table_args__ = (Index(None, "wake_at"), Index(None, "key"))

    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    step_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    key: Mapped[str] = mapped_column(Text)
    rate_limit: Mapped[int]
    window_s: Mapped[float]
    units: Mapped[int]
    parked_at: Mapped[datetime]
    wake_at: Mapped[datetime]
