"""Submitting jobs: a request resolved to a profile and checked params, stored with its step rows
before anything is sent (one job per idempotency key), alone or in batches that are refused
when the pipeline they named has changed since it was resolved."""

import hashlib
import json
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from service.catalogue.notices import validate_notify_url
from service.catalogue.pipelines import own_or_shared
from service.catalogue.resolution import ResolvedPipeline, resolve_pipeline
from service.engine.concurrency import WAITING_FOR_TURN, let_in, slot_values, take_turns
from service.language.checks import validate_profile
from service.language.params import resolve_params
from service.language.profiles import Profile
from service.language.snapshots import profile_secrets, step_facts
from service.platform import metrics
from service.platform.audit import Actor, audit_columns, submit_events
from service.platform.clock import utcnow
from service.platform.constants import OPEN_JOBS_RETRY_AFTER_S, SHARD_NONE
from service.platform.db import driver
from service.platform.errors import (
    IdempotencyConflict,
    OpenJobsLimit,
)
from service.platform.models import JobRow
from service.platform.secrets import Secrets
from service.platform.states import JOB_OPEN, JobStatus, StepStatus


@dataclass(frozen=True)
class JobRequest:
    pipeline: str | Mapping[str, Any]
    params: Mapping[str, Any]
    idempotency_key: str | None = None
    trigger: str = "api"
    parent_job_id: uuid.UUID | None = None
    schedule_id: uuid.UUID | None = None
    scheduled_for: datetime | None = None
    diff_mode: bool = False
    notify_url: str | None = None
    priority: int | None = None
    """``None`` takes the profile's."""
    timeout_s: int | None = None
    """The job's deadline from its submission (a schedule's); ``None`` takes the profile's."""


def resolve_request(
    session: Session,
    pipeline: str | Mapping[str, Any],
    *,
    owner: str,
    profiles_dir: Path | None,
    known_actions: Collection[str],
) -> ResolvedPipeline:
    """A name resolves to the owner's saved pipeline, one shared with it, or a shipped profile,
    in that order; an inline profile stands for itself and comes from no saved pipeline."""
    if not isinstance(pipeline, str):
        profile = validate_profile(dict(pipeline), source="inline", known_actions=known_actions)
        return ResolvedPipeline(profile, None, None)
    return resolve_pipeline(
        session, pipeline, owner=owner, profiles_dir=profiles_dir, known_actions=known_actions
    )


def _request_hash(profile: Profile, params: Mapping[str, Any], request: JobRequest) -> str:
    """What makes two submissions the same request, for idempotency keys."""
    canonical = json.dumps(
        {
            "profile": profile.content_hash(),
            "params": params,
            "diff_mode": request.diff_mode,
            "notify_url": request.notify_url,
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def check_open_jobs(session: Session, owner: str, limit: int) -> None:
    """Refuse a new job when ``owner`` already has ``limit`` open ones (0: no limit).

    A cap, not a fence: two submissions at the same moment may both pass at ``limit - 1``;
    the count reads at most ``limit`` entries of an index of open jobs, whatever the history.
    """
    if limit <= 0:
        return
    open_jobs = session.scalar(
        select(func.count()).select_from(
            select(JobRow.id)
            .where(JobRow.owner == owner, JobRow.status.in_(sorted(JOB_OPEN)))
            .limit(limit)
            .subquery()
        )
    )
    if open_jobs is not None and open_jobs >= limit:
        raise OpenJobsLimit(
            f"{owner} has {limit} jobs queued, running or waiting; the limit is {limit}",
            {"limit": limit, "retry_after_s": OPEN_JOBS_RETRY_AFTER_S},
        )


def submit_job(
    session: Session,
    request: JobRequest,
    *,
    owner: str,
    profiles_dir: Path | None,
    known_actions: Collection[str],
    publish_now: bool = True,
    open_jobs_limit: int = 0,
    fair_share_ahead: int = 0,
    secrets: Secrets | None = None,
    audit: Actor | None = None,
) -> tuple[JobRow, bool]:
    """Store a queued job and its steps. Returns the job and whether it is new.

    With ``publish_now`` the job is recorded as sent: the caller publishes right after the
    commit and marks it unsent if that fails. Should the caller die in between, the
    sweeper finds the job as stalled.

    The same idempotency key with the same request returns the first job; with a different
    request it is refused, so a client retrying a timeout cannot start a second run.
    With ``fair_share_ahead``, a job without a concurrency key waits its turn
    (``concurrency.take_turns``) unless it comes now.
    A new job counts against the owner's ``open_jobs_limit`` (``check_open_jobs``, 0: none); a
    replay of a key does not, as it starts nothing, so it gets its job at the limit too.
    With ``secrets``, a new job whose profile names a secret its owner lacks is refused.

    With ``audit``, the statement that stores a new job records its ``job.submit`` event too
    (a replay stores nothing, so it records nothing).

    Everything it reads is read-only and its one write is a single statement, so a caller may
    run it in autocommit (``service.platform.db.autocommit``) and still store all of a job or none;
    a job stored waiting then lets itself in, in one more statement, or is let in by the beat.
    """
    resolved = resolve_request(
        session,
        request.pipeline,
        owner=owner,
        profiles_dir=profiles_dir,
        known_actions=known_actions,
    )
    if request.notify_url is not None:
        validate_notify_url(request.notify_url)
    profile = resolved.profile
    params = resolve_params(profile, request.params)
    request_hash = _request_hash(profile, params, request)
    if request.idempotency_key:
        existing = _by_idempotency_key(session, owner, request.idempotency_key)
        if existing is not None:
            return _same_request(existing, request_hash), False
    if secrets is not None:
        secrets.require(profile_secrets(profile), owner)
    check_open_jobs(session, owner, open_jobs_limit)
    job = _job_values(request, resolved, params, request_hash, owner, publish_now)
    if fair_share_ahead and job["waiting_for"] is None:
        job.update(waiting_for=WAITING_FOR_TURN, dispatched_at=None)
    if insert_job(session, job, step_rows(profile), audit):
        job = take_slot(session, job, publish_now)
        return JobRow(**take_turn(session, job, fair_share_ahead, publish_now)), True
    raced = _by_idempotency_key(session, owner, request.idempotency_key or "")
    if raced is None:
        raise IdempotencyConflict(
            "the job first stored under this idempotency_key is gone; use a new key",
            {"idempotency_key": request.idempotency_key},
        )
    return _same_request(raced, request_hash), False


def _job_values(
    request: JobRequest,
    resolved: ResolvedPipeline,
    params: dict[str, Any],
    request_hash: str,
    owner: str,
    publish_now: bool,
) -> dict[str, Any]:
    profile = resolved.profile
    now = utcnow()
    timeout_s = profile.timeout_s if request.timeout_s is None else request.timeout_s
    return {
        "id": uuid.uuid4(),
        "owner": owner,
        "pipeline": profile.name,
        "profile": profile.to_json(),
        "profile_hash": profile.content_hash(),
        "params": params,
        "status": JobStatus.QUEUED,
        "trigger": request.trigger,
        "priority": profile.priority if request.priority is None else request.priority,
        "queue": profile.entry_queue(),
        "parent_job_id": request.parent_job_id,
        "idempotency_key": request.idempotency_key,
        "request_hash": request_hash,
        "created_at": now,
        "dispatched_at": now if publish_now else None,
        "diff_mode": request.diff_mode,
        "notify_url": request.notify_url,
        "pipeline_id": resolved.pipeline_id,
        "pipeline_version": resolved.version,
        "schedule_id": request.schedule_id,
        "scheduled_for": request.scheduled_for,
        **slot_values(profile, owner, params),
        "deadline_at": None if timeout_s is None else now + timedelta(seconds=timeout_s),
    }


_JOB_COLUMNS = (
    "id", "owner", "pipeline", "profile", "profile_hash", "params", "status", "trigger",
    "priority", "queue", "parent_job_id", "idempotency_key", "request_hash", "created_at",
    "dispatched_at",
    "diff_mode", "notify_url", "pipeline_id", "pipeline_version", "schedule_id", "scheduled_for",
    "concurrency_key", "concurrency_limit", "waiting_for",
    "deadline_at",
)  # fmt: skip
_STEP_COLUMNS = """step_id text, depends_on text[], inputs_from text[], status text,
                    waiting_on int, finished_at timestamptz"""


def _new_steps(steps_from: str) -> str:
    """The step rows of the jobs that the statement's ``new_job`` stored, from ``steps_from``:
    the job's ``new_job`` row and the recordset of its steps."""
    return f"""
    ), new_steps AS (
        INSERT INTO step_runs (job_id, step_id, shard, status, attempts, depends_on,
                               inputs_from, waiting_on, finished_at)
        SELECT new_job.id, s.step_id, {SHARD_NONE}, s.status, 0, s.depends_on, s.inputs_from,
               s.waiting_on, s.finished_at
          FROM {steps_from} AS s({_STEP_COLUMNS})
    )"""


_INSERT_JOB = (
    f"""
    WITH new_job AS (
        INSERT INTO jobs ({", ".join(_JOB_COLUMNS)})
        VALUES ({", ".join(f"%({column})s" for column in _JOB_COLUMNS)})
        ON CONFLICT (owner, idempotency_key) DO NOTHING
        RETURNING id"""
    + _new_steps("new_job, jsonb_to_recordset(%(steps)s)")
    + submit_events(
        "%(created_at)s::timestamptz, %(audit_channel)s::text, %(audit_source)s::text,"
        " %(audit_actor)s::text, %(owner)s::text, %(pipeline)s::text, %(pipeline_version)s::int",
        "new_job WHERE %(audit_channel)s::text IS NOT NULL",
    )
    + " SELECT count(*) FROM new_job"
)


_JOB_TYPES = {
    "id": "uuid", "profile": "jsonb", "params": "jsonb", "parent_job_id": "uuid", "priority": "int",
    "created_at": "timestamptz", "dispatched_at": "timestamptz", "diff_mode": "boolean",
    "pipeline_id": "uuid", "pipeline_version": "integer", "schedule_id": "uuid",
    "scheduled_for": "timestamptz", "concurrency_limit": "integer", "deadline_at": "timestamptz",
}  # fmt: skip
_BATCH_COLUMNS = ", ".join(
    [f"{c} {_JOB_TYPES.get(c, 'text')}" for c in _JOB_COLUMNS]
    + ["ord int", "name text", "seen text", "steps jsonb"]
    + [f"{column} text" for column in audit_columns(None)]
)
_OPEN_STATUSES = ", ".join(f"'{status}'" for status in sorted(JOB_OPEN))
_INSERT_JOBS_IF_RESOLVED = (
    f"""
    WITH batch AS (
        SELECT b.* FROM jsonb_to_recordset(%(jobs)s) AS b({_BATCH_COLUMNS})
    ), fresh AS (
        SELECT batch.*, row_number() OVER (PARTITION BY batch.owner ORDER BY batch.ord)
                        AS owner_rank
          FROM batch
         WHERE batch.idempotency_key IS NULL
            OR (NOT EXISTS (SELECT 1 FROM jobs
                             WHERE jobs.owner = batch.owner
                               AND jobs.idempotency_key = batch.idempotency_key)
                AND NOT EXISTS (SELECT 1 FROM batch AS earlier
                                 WHERE earlier.owner = batch.owner
                                   AND earlier.idempotency_key = batch.idempotency_key
                                   AND earlier.ord < batch.ord))
    ), allowed AS (
        SELECT * FROM fresh
         WHERE coalesce((SELECT id::text || ' ' || current_version
                           FROM ({own_or_shared("fresh.name", "fresh.owner")}) AS resolved), '')
               = fresh.seen
           AND (%(cap)s <= 0 OR (
                SELECT count(*) FROM (
                    SELECT 1 FROM jobs
                     WHERE owner = fresh.owner AND status IN ({_OPEN_STATUSES})
                     LIMIT greatest(%(cap)s, 0)
                ) AS open_jobs) + fresh.owner_rank <= %(cap)s)
    ), new_job AS (
        INSERT INTO jobs ({", ".join(_JOB_COLUMNS)})
        SELECT {", ".join(_JOB_COLUMNS)} FROM allowed ORDER BY ord
        ON CONFLICT (owner, idempotency_key) DO NOTHING
        RETURNING id"""
    + _new_steps("new_job JOIN allowed USING (id), jsonb_to_recordset(allowed.steps)")
    + submit_events(
        "allowed.created_at, allowed.audit_channel, allowed.audit_source, allowed.audit_actor,"
        " allowed.owner, allowed.pipeline, allowed.pipeline_version",
        "new_job JOIN allowed USING (id) WHERE allowed.audit_channel IS NOT NULL",
    )
    + " SELECT id FROM new_job"
)


@dataclass(frozen=True)
class NewJob:
    """A job to be sent right after it is stored (``insert_jobs_if_resolved``): its row, its
    step rows, and the pipeline name it was asked for by."""

    values: dict[str, Any]
    steps: list[dict[str, Any]]
    name: str
    audit: Actor | None = None

    @property
    def id(self) -> uuid.UUID:
        job_id: uuid.UUID = self.values["id"]
        return job_id

    @property
    def priority(self) -> int:
        priority: int = self.values["priority"]
        return priority


def new_job(
    request: JobRequest,
    resolved: ResolvedPipeline,
    *,
    owner: str,
    name: str,
    audit: Actor | None = None,
) -> NewJob:
    """The job ``submit_job`` would store for ``request``, asked for by the pipeline ``name``;
    with ``audit``, the statement that stores it records its ``job.submit`` event."""
    params = resolve_params(resolved.profile, request.params)
    request_hash = _request_hash(resolved.profile, params, request)
    values = _job_values(request, resolved, params, request_hash, owner, True)
    return NewJob(values, step_rows(resolved.profile), name, audit)


async def insert_jobs_if_resolved(
    conn: psycopg.AsyncConnection[Any], jobs: Sequence[NewJob], *, open_jobs_limit: int
) -> set[uuid.UUID]:
    """The ids of the jobs stored, in one statement on an autocommitted connection. A job is
    stored only if its idempotency key is free (not stored, nor taken by an earlier job of the
    batch), its name still resolves for its owner to the saved pipeline and version of its row
    (or still to no saved pipeline), and its owner is under ``open_jobs_limit`` counting the
    batch's earlier jobs with a free key: a replay starts nothing, so it takes no place under
    the cap from a new job beside it.

    A job left out says only that it was not stored: ``submit_job`` then finds out why and
    answers as it always does. One statement instead of the lookup, the open-jobs count and
    the insert, for every job of the batch: one round trip and one commit, and the lookup can
    be skipped safely from a hint.
    """
    rows = [_batch_row(ord_, job) for ord_, job in enumerate(jobs)]
    cursor = await conn.execute(
        _INSERT_JOBS_IF_RESOLVED, {"jobs": Jsonb(rows), "cap": open_jobs_limit}
    )
    stored = {row[0] for row in await cursor.fetchall()}
    for job in jobs:
        if job.id in stored:
            metrics.JOBS_SUBMITTED.labels(job.values["pipeline"], job.values["trigger"]).inc()
    return stored


_LET_IN_NEW = """
    SELECT let.job FROM unnest(%(keys)s::text[], %(limits)s::int[], %(ids)s::uuid[])
                        WITH ORDINALITY AS w(key, lim, id, ord)
     CROSS JOIN LATERAL flowbeat_let_in(w.key, w.lim, w.id, %(sent_at)s) AS let(job)
     ORDER BY w.ord
"""


async def let_in_new(
    conn: psycopg.AsyncConnection[Any], jobs: Sequence[NewJob], *, sent_at: datetime
) -> set[uuid.UUID]:
    """The stored jobs of ``jobs`` waiting for a slot that take one now, in one statement, as
    ``take_slot`` does for a job stored alone: each only if none of its key waits ahead of
    it, so those are left to the beat that their storing woke."""
    waiting = [job for job in jobs if job.values["waiting_for"] is not None]
    if not waiting:
        return set()
    cursor = await conn.execute(
        _LET_IN_NEW,
        {
            "keys": [job.values["concurrency_key"] for job in waiting],
            "limits": [job.values["concurrency_limit"] for job in waiting],
            "ids": [job.id for job in waiting],
            "sent_at": sent_at,
        },
    )
    let = {row[0] for row in await cursor.fetchall()}
    for job in waiting:
        if job.id in let:
            job.values.update(waiting_for=None, dispatched_at=sent_at)
    return let


def _batch_row(ord_: int, job: NewJob) -> dict[str, Any]:
    values = job.values
    pipeline_id = values["pipeline_id"]
    seen = "" if pipeline_id is None else f"{pipeline_id} {values['pipeline_version']}"
    row = {column: _json_value(values[column]) for column in _JOB_COLUMNS}
    row.update(ord=ord_, name=job.name, seen=seen, steps=job.steps, **audit_columns(job.audit))
    return row


def _json_value(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def step_rows(
    profile: Profile, reused: Collection[str] = (), now: datetime | None = None
) -> list[dict[str, Any]]:
    """The step rows of a new job: ``reused`` steps (a rerun's) settled at ``now``, the rest
    pending on as many upstream steps as are not reused."""
    return [
        {
            "step_id": step.id,
            "depends_on": list(step.depends_on),
            "inputs_from": sorted(step_facts(profile, step.id).referenced),
            "status": StepStatus.REUSED if step.id in reused else StepStatus.PENDING,
            "waiting_on": len(set(step.depends_on) - set(reused)),
            "finished_at": now.isoformat() if step.id in reused and now else None,
        }
        for step in profile.steps
    ]


def _insert_values(
    job: dict[str, Any], steps: list[dict[str, Any]], audit: Actor | None
) -> dict[str, Any]:
    """The parameters both job inserts share: the job's row and its steps' rows."""
    return {
        **job,
        "profile": Jsonb(job["profile"]),
        "params": Jsonb(job["params"]),
        "steps": Jsonb(steps),
        **audit_columns(audit),
    }


def insert_job(
    session: Session,
    job: dict[str, Any],
    steps: list[dict[str, Any]],
    audit: Actor | None = None,
) -> bool:
    """The job and its steps (and, with ``audit``, its audit event) in one constant statement;
    ``False`` if its idempotency key was taken first. ``ON CONFLICT`` waits for a concurrent
    holder of the key to commit or roll back, so a key is never stored twice and no savepoint
    is needed."""
    row = driver(session).execute(_INSERT_JOB, _insert_values(job, steps, audit)).fetchone()
    inserted = row is not None and row[0] == 1
    if inserted:
        counter = metrics.JOBS_SUBMITTED.labels(job["pipeline"], job["trigger"])
        metrics.after_commit(session, counter.inc)
    return inserted


def take_slot(session: Session, job: dict[str, Any], publish_now: bool) -> dict[str, Any]:
    """A job stored waiting for a slot of its key takes one now if its turn has come; the
    values it then has. One that still waits is sent by whoever lets it in."""
    key, sent_at = job["concurrency_key"], utcnow() if publish_now else None
    if key is None or not let_in(
        session, key, job["concurrency_limit"], sent_at=sent_at, only=job["id"]
    ):
        return job
    return {**job, "waiting_for": None, "dispatched_at": sent_at}


def take_turn(
    session: Session, job: dict[str, Any], ahead: int, publish_now: bool
) -> dict[str, Any]:
    """A job stored waiting its turn takes it now if it has come."""
    if job["waiting_for"] != WAITING_FOR_TURN:
        return job
    sent_at = utcnow() if publish_now else None
    if not take_turns(session, ahead, sent_at=sent_at, only=job["id"]):
        return job
    return {**job, "waiting_for": None, "dispatched_at": sent_at}


def _by_idempotency_key(session: Session, owner: str, key: str) -> JobRow | None:
    return session.scalars(
        select(JobRow).where(JobRow.owner == owner, JobRow.idempotency_key == key)
    ).one_or_none()


def _same_request(job: JobRow, request_hash: str) -> JobRow:
    if job.request_hash != request_hash:
        raise IdempotencyConflict(
            "this idempotency_key was used with a different pipeline or params",
            {"job_id": str(job.id)},
        )
    return job


def mark_dispatched(session: Session, job_id: uuid.UUID, now: datetime | None) -> None:
    """``None`` marks a job as never sent, for the sweeper to send after its grace period."""
    session.execute(update(JobRow).where(JobRow.id == job_id).values(dispatched_at=now))
