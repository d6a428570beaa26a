"""Submitting jobs: a request resolved to a profile and checked params, stored with its step rows
before anything is sent (one job per idempotency key), alone or in batches that are refused
when the pipeline they named has changed since it was resolved."""

import hashlib
import json
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any

from psycopg.types.json import Jsonb
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from service.catalogue.notices import validate_notify_url
from service.catalogue.resolution import ResolvedPipeline, resolve_pipeline
from service.engine.concurrency import (
    SLOT_ROOM,
    WAITING_FOR_SLOT,
    WAITING_FOR_TURN,
    admitted,
    slot_values,
    take_turns,
)
from service.engine.dedupe import (
    DEDUPE_TWIN,
    Dedupe,
    dedupe_key,
    dedupe_of,
    duplicate_of,
    find_twin,
)
from service.engine.inline_events import STORED_LOGGED, stored
from service.engine.profiles import keep_profiles
from service.language.checks import validate_profile
from service.language.labels import job_labels
from service.language.params import resolve_params
from service.language.profiles import Profile
from service.language.snapshots import profile_secrets, step_facts
from service.platform import metrics, tracing
from service.platform.audit import Actor, audit_columns, submit_events
from service.platform.clock import utcnow
from service.platform.constants import OPEN_JOBS_RETRY_AFTER_S, SHARD_NONE
from service.platform.db import driver
from service.platform.errors import (
    IdempotencyConflict,
    OpenJobsLimit,
)
from service.platform.models import KEYED, JobRow
from service.platform.secrets import Secrets
from service.platform.states import JOB_OPEN, JobStatus, StepStatus


class Outcome(StrEnum):
    """What a submission came to: a new job, or an existing one it was answered with."""

    NEW = "new"
    REPLAYED = "replayed"
    """The job first stored under the request's ``idempotency_key``."""
    DEDUPLICATED = "deduplicated"
    """The open or recent job its profile's ``dedupe`` key matched."""


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
    labels: Mapping[str, str] = field(default_factory=dict)
    """Checked by ``check_labels`` when the job is built (``job_values``)."""
    refresh: bool = False
    """Its cache-declaring steps run their actions, whatever the step cache holds."""


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


def request_hash_of(profile: Profile, params: Mapping[str, Any], request: JobRequest) -> str:
    """What makes two submissions the same request, for idempotency keys; labels count only
    when given, so the hash of a request without them is what it was before labels."""
    labels = {"labels": dict(request.labels)} if request.labels else {}
    refresh = {"refresh": True} if request.refresh else {}
    canonical = json.dumps(
        {
            "profile": profile.content_hash(),
            "params": params,
            "diff_mode": request.diff_mode,
            "notify_url": request.notify_url,
            **labels,
            **refresh,
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
    idempotency_ttl_s: float | None = None,
) -> tuple[JobRow, Outcome]:
    """Store a queued job and its steps. Returns the job and whether it is new, or which
    existing job answers instead.

    With ``publish_now`` the job is recorded as sent: the caller publishes right after the
    commit and marks it unsent if that fails. Should the caller die in between, the
    sweeper finds the job as stalled.

    The same idempotency key with the same request returns the first job; with a different
    request it is refused, so a client retrying a timeout cannot start a second run. A key
    answers for ``idempotency_ttl_s`` from its job's submission (``None``: until retention
    prunes the job); the first submission with it after that frees it and stores a new job.
    A job whose profile's ``dedupe`` key matches an open or recent job of the owner's pipeline
    is answered with that job, or refused ``DuplicateJob`` (``service.engine.dedupe``).
    With ``fair_share_ahead``, a job without a concurrency key waits its turn
    (``concurrency.take_turns``) unless it comes now.
    A new job counts against the owner's ``open_jobs_limit`` (``check_open_jobs``, 0: none); a
    replay of a key does not, as it starts nothing, so it gets its job at the limit too.
    With ``secrets``, a new job whose profile names a secret its owner lacks is refused.

    With ``audit``, the statement that stores a new job records its ``job.submit`` event too
    (a replay stores nothing, so it records nothing).

    Everything it reads is read-only and its one write is a single statement, so a caller may
    run it in autocommit (``service.platform.db.autocommit``) and still store all of a job or none;
    that statement stores a keyed job let in if a slot of its key is free and none of it waits,
    else waiting for the beat to let it in.
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
    request_hash = request_hash_of(profile, params, request)
    if request.idempotency_key:
        existing = _by_idempotency_key(session, owner, request.idempotency_key, idempotency_ttl_s)
        if existing is not None:
            return _same_request(existing, request_hash), Outcome.REPLAYED
    job = job_values(request, resolved, params, request_hash, owner, publish_now)
    dedupe = dedupe_of(profile, job)
    if dedupe is not None and (twin := find_twin(session, dedupe)) is not None:
        return duplicate_of(session, twin, dedupe), Outcome.DEDUPLICATED
    if secrets is not None:
        secrets.require(profile_secrets(profile), owner)
    check_open_jobs(session, owner, open_jobs_limit)
    if fair_share_ahead and job["waiting_for"] is None:
        job.update(waiting_for=WAITING_FOR_TURN, dispatched_at=None)
    inserted = insert_job(session, job, step_rows(profile), audit, dedupe)
    if inserted.stored is not None:
        stored = take_turn(session, inserted.stored, fair_share_ahead, publish_now)
        return JobRow(**stored), Outcome.NEW
    if inserted.twin is not None and dedupe is not None:
        return duplicate_of(session, inserted.twin, dedupe), Outcome.DEDUPLICATED
    raced = _by_idempotency_key(session, owner, request.idempotency_key or "", None)
    if raced is None:
        raise IdempotencyConflict(
            "the job first stored under this idempotency_key is gone; use a new key",
            {"idempotency_key": request.idempotency_key},
        )
    return _same_request(raced, request_hash), Outcome.REPLAYED


def job_values(
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
        "refresh": request.refresh,
        "notify_url": request.notify_url,
        "pipeline_id": resolved.pipeline_id,
        "pipeline_version": resolved.version,
        "schedule_id": request.schedule_id,
        "scheduled_for": request.scheduled_for,
        **slot_values(profile, owner, params),
        "dedupe_key": dedupe_key(profile, params),
        "deadline_at": None if timeout_s is None else now + timedelta(seconds=timeout_s),
        "traceparent": tracing.traceparent(),
        "labels": job_labels(profile.labels, params, request.labels),
    }


JOB_COLUMNS = (
    "id", "owner", "pipeline", "profile_hash", "params", "status", "trigger",
    "priority", "queue", "parent_job_id", "idempotency_key", "request_hash", "created_at",
    "dispatched_at",
    "diff_mode", "notify_url", "pipeline_id", "pipeline_version", "schedule_id", "scheduled_for",
    "concurrency_key", "concurrency_limit", "waiting_for",
    "deadline_at", "traceparent", "labels", "dedupe_key", "refresh",
)  # fmt: skip
_STEP_COLUMNS = """step_id text, depends_on text[], inputs_from text[], status text,
                    waiting_on int, finished_at timestamptz"""


def new_steps(steps_from: str) -> str:
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


_STORED_AS = admitted(
    "(SELECT let FROM slot)", "%(waiting_for)s::text", "%(dispatched_at)s::timestamptz"
)
_NO_TWIN = "NOT EXISTS (SELECT FROM twin WHERE id IS NOT NULL)"
_INSERT_JOB = (
    f"""
    WITH twin AS (
        SELECT {DEDUPE_TWIN}(%(owner)s::text, %(pipeline)s::text, %(dedupe_key)s::text,
                             %(dedupe_since)s::timestamptz) AS id
         WHERE %(dedupe_since)s::timestamptz IS NOT NULL
    ), slot AS (
        SELECT {SLOT_ROOM}(%(concurrency_key)s::text, %(concurrency_limit)s::int) > 0 AS let
         WHERE %(waiting_for)s::text = '{WAITING_FOR_SLOT}' AND {_NO_TWIN}
    ), new_job AS (
        INSERT INTO jobs ({", ".join(JOB_COLUMNS)}, {STORED_LOGGED})
        SELECT {", ".join(_STORED_AS.get(column, f"%({column})s") for column in JOB_COLUMNS)},
               true
         WHERE {_NO_TWIN}
        ON CONFLICT (owner, idempotency_key) WHERE {KEYED} DO NOTHING
        RETURNING id, waiting_for, dispatched_at, status, trigger"""
    + new_steps("new_job, jsonb_to_recordset(%(steps)s)")
    + f", {keep_profiles('SELECT %(profile_hash)s, %(profile)s FROM new_job')}"
    + submit_events(
        "%(created_at)s::timestamptz, %(audit_channel)s::text, %(audit_source)s::text,"
        " %(audit_actor)s::text, %(owner)s::text, %(pipeline)s::text, %(pipeline_version)s::int",
        "new_job WHERE %(audit_channel)s::text IS NOT NULL",
    )
    + stored()
    + " SELECT waiting_for, dispatched_at, NULL::uuid FROM new_job"
    + " UNION ALL SELECT NULL, NULL, id FROM twin WHERE id IS NOT NULL"
)
"""A job with a dedupe key is stored only if ``DEDUPE_TWIN``, asked first, finds no job it
duplicates; a keyed job is then stored let in or waiting by asking ``SLOT_ROOM``. The locks
they take, in that order, are held until the caller commits the job."""


@dataclass(frozen=True)
class Inserted:
    stored: dict[str, Any] | None
    """The job's values as stored; ``None`` when its idempotency key was taken first or it
    duplicates ``twin``."""
    twin: uuid.UUID | None = None
    """The job its dedupe key matched, which kept it out."""


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
        "labels": Jsonb(job.get("labels", {})),
        "steps": Jsonb(steps),
        **audit_columns(audit),
    }


def insert_job(
    session: Session,
    job: dict[str, Any],
    steps: list[dict[str, Any]],
    audit: Actor | None = None,
    dedupe: Dedupe | None = None,
) -> Inserted:
    """The job and its steps (and, with ``audit``, its audit event) in one constant statement:
    the job's values as stored (a keyed job let in or left waiting), or nothing if its
    idempotency key was taken first or, with ``dedupe``, the job it duplicates. ``ON CONFLICT``
    waits for a concurrent holder of the key to commit or roll back, so a key is never stored
    twice and no savepoint is needed."""
    values = _insert_values(job, steps, audit)
    values["dedupe_since"] = None if dedupe is None else dedupe.since
    row = driver(session).execute(_INSERT_JOB, values).fetchone()
    if row is None:
        return Inserted(None)
    if row[2] is not None:
        return Inserted(None, row[2])
    counter = metrics.JOBS_SUBMITTED.labels(job["pipeline"], job["trigger"])
    metrics.after_commit(session, counter.inc)
    return Inserted({**job, "waiting_for": row[0], "dispatched_at": row[1]})


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


def _by_idempotency_key(
    session: Session, owner: str, key: str, ttl_s: float | None
) -> JobRow | None:
    """The job that answers for ``key``; one stored more than ``ttl_s`` ago no longer does,
    and gives the key up (the unique (owner, key) would refuse the new job)."""
    job = session.scalars(
        select(JobRow).where(JobRow.owner == owner, JobRow.idempotency_key == key)
    ).one_or_none()
    if job is None or ttl_s is None or job.created_at > utcnow() - timedelta(seconds=ttl_s):
        return job
    session.execute(
        update(JobRow)
        .where(JobRow.id == job.id, JobRow.idempotency_key == key)
        .values(idempotency_key=None)
    )
    return None


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
