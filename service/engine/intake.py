"""The event loop's intake: jobs that arrive together are stored in one statement on an
autocommitted connection, the keyed ones let in or left waiting by that statement, and sent
together; what this path cannot take it leaves to ``service.engine.submission.submit_job``,
which answers as it always has."""

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from service.catalogue.pipelines import own_or_shared
from service.catalogue.resolution import ResolvedPipeline
from service.engine.concurrency import SLOT_ROOM, WAITING_FOR_SLOT, admitted
from service.engine.dedupe import DEDUPE_TWIN, dedupe_of
from service.engine.inline_events import STORED_LOGGED, stored
from service.engine.profiles import keep_profiles
from service.engine.submission import (
    JOB_COLUMNS,
    JobRequest,
    job_values,
    new_steps,
    request_hash_of,
    step_rows,
)
from service.language.params import resolve_params
from service.platform import metrics
from service.platform.audit import Actor, audit_columns, submit_events
from service.platform.models import KEYED
from service.platform.states import JOB_OPEN

_JOB_TYPES = {
    "id": "uuid", "profile": "jsonb", "params": "jsonb", "parent_job_id": "uuid", "priority": "int",
    "created_at": "timestamptz", "dispatched_at": "timestamptz", "diff_mode": "boolean",
    "pipeline_id": "uuid", "pipeline_version": "integer", "schedule_id": "uuid",
    "scheduled_for": "timestamptz", "concurrency_limit": "integer", "deadline_at": "timestamptz",
    "labels": "jsonb", "refresh": "boolean",
}  # fmt: skip
_BATCH_COLUMNS = ", ".join(
    [f"{c} {_JOB_TYPES.get(c, 'text')}" for c in JOB_COLUMNS]
    + ["ord int", "name text", "seen text", "steps jsonb", "dedupe_since timestamptz"]
    + ["profile jsonb"]
    + [f"{column} text" for column in audit_columns(None)]
)
_OPEN_STATUSES = ", ".join(f"'{status}'" for status in sorted(JOB_OPEN))
_STORED_AS = admitted("let", "waiting_for", "dispatched_at")
_INSERT_JOBS_IF_RESOLVED = (
    f"""
    WITH batch AS (
        SELECT b.* FROM jsonb_to_recordset(%(jobs)s) AS b({_BATCH_COLUMNS})
    ), twins AS (
        SELECT keys.owner, keys.pipeline, keys.dedupe_key,
               {DEDUPE_TWIN}(keys.owner, keys.pipeline, keys.dedupe_key, keys.dedupe_since)
               AS id
          FROM (SELECT DISTINCT ON (owner, pipeline, dedupe_key)
                       owner, pipeline, dedupe_key, dedupe_since
                  FROM batch WHERE dedupe_since IS NOT NULL
                 ORDER BY owner, pipeline, dedupe_key, ord) AS keys
    ), fresh AS (
        SELECT batch.*, row_number() OVER (PARTITION BY batch.owner ORDER BY batch.ord)
                        AS owner_rank
          FROM batch
         WHERE (batch.idempotency_key IS NULL
                OR (NOT EXISTS (SELECT 1 FROM jobs
                                 WHERE jobs.owner = batch.owner AND jobs.{KEYED}
                                   AND jobs.idempotency_key = batch.idempotency_key)
                    AND NOT EXISTS (SELECT 1 FROM batch AS earlier
                                     WHERE earlier.owner = batch.owner
                                       AND earlier.idempotency_key = batch.idempotency_key
                                       AND earlier.ord < batch.ord)))
           AND (batch.dedupe_since IS NULL
                OR (NOT EXISTS (SELECT 1 FROM twins
                                 WHERE twins.owner = batch.owner
                                   AND twins.pipeline = batch.pipeline
                                   AND twins.dedupe_key = batch.dedupe_key
                                   AND twins.id IS NOT NULL)
                    AND NOT EXISTS (SELECT 1 FROM batch AS earlier
                                     WHERE earlier.owner = batch.owner
                                       AND earlier.pipeline = batch.pipeline
                                       AND earlier.dedupe_key = batch.dedupe_key
                                       AND earlier.ord < batch.ord)))
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
    ), rooms AS (
        SELECT keys.key, {SLOT_ROOM}(keys.key, keys.lim) AS n
          FROM (SELECT DISTINCT ON (concurrency_key) concurrency_key AS key,
                       concurrency_limit AS lim
                  FROM allowed WHERE waiting_for = '{WAITING_FOR_SLOT}'
                 ORDER BY concurrency_key, ord DESC) AS keys
    ), placed AS (
        SELECT allowed.*,
               CASE WHEN allowed.waiting_for = '{WAITING_FOR_SLOT}' THEN
                   row_number() OVER (PARTITION BY allowed.concurrency_key
                                      ORDER BY allowed.priority DESC, allowed.ord)
                   <= rooms.n
               END AS let
          FROM allowed
          LEFT JOIN rooms ON allowed.waiting_for = '{WAITING_FOR_SLOT}'
                         AND rooms.key = allowed.concurrency_key
    ), new_job AS (
        INSERT INTO jobs ({", ".join(JOB_COLUMNS)}, {STORED_LOGGED})
        SELECT {", ".join(_STORED_AS.get(column, column) for column in JOB_COLUMNS)}, true
          FROM placed ORDER BY ord
        ON CONFLICT (owner, idempotency_key) WHERE {KEYED} DO NOTHING
        RETURNING id, waiting_for, dispatched_at, status, trigger"""
    + new_steps("new_job JOIN allowed USING (id), jsonb_to_recordset(allowed.steps)")
    + ", "
    + keep_profiles(
        "SELECT DISTINCT ON (allowed.profile_hash) allowed.profile_hash, allowed.profile"
        " FROM new_job JOIN allowed USING (id) ORDER BY allowed.profile_hash"
    )
    + submit_events(
        "allowed.created_at, allowed.audit_channel, allowed.audit_source, allowed.audit_actor,"
        " allowed.owner, allowed.pipeline, allowed.pipeline_version",
        "new_job JOIN allowed USING (id) WHERE allowed.audit_channel IS NOT NULL",
    )
    + stored()
    + " SELECT id, waiting_for, dispatched_at FROM new_job"
)
"""``twins`` asks ``DEDUPE_TWIN`` once a dedupe key of the batch, in the keys' order, and a
job is left out when it finds a job the new one duplicates, or an earlier job of the batch has
its key (``submit_job`` then answers it, finding that job); every ``twins`` lock is taken
before any slot's, as ``submit_job``'s statement takes them. ``rooms`` asks ``SLOT_ROOM`` once
a key of the batch, in the keys' order (so two batches take their keys' locks in one order),
and a key's jobs of the batch take its free slots by priority, then in their order (as
``flowbeat_let_in`` lets in waiting ones), before any job is inserted; the locks are held until
the statement commits."""


@dataclass(frozen=True)
class NewJob:
    """A job to be sent right after it is stored (``insert_jobs_if_resolved``): its row, its
    step rows, and the pipeline name it was asked for by."""

    values: dict[str, Any]
    steps: list[dict[str, Any]]
    name: str
    audit: Actor | None = None
    dedupe_since: datetime | None = None
    """With a dedupe key: from when an ended job of the key is one this job duplicates."""

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
    request_hash = request_hash_of(resolved.profile, params, request)
    values = job_values(request, resolved, params, request_hash, owner, True)
    dedupe = dedupe_of(resolved.profile, values)
    since = None if dedupe is None else dedupe.since
    return NewJob(values, step_rows(resolved.profile), name, audit, since)


async def insert_jobs_if_resolved(
    conn: psycopg.AsyncConnection[Any], jobs: Sequence[NewJob], *, open_jobs_limit: int
) -> set[uuid.UUID]:
    """The ids of the jobs stored, in one statement on an autocommitted connection. A job is
    stored only if its idempotency key is free (not stored, nor taken by an earlier job of the
    batch), its dedupe key matches no open or recent job (nor an earlier job of the batch),
    its name still resolves for its owner to the saved pipeline and version of its row
    (or still to no saved pipeline), and its owner is under ``open_jobs_limit`` counting the
    batch's earlier jobs with a free key: a replay starts nothing, so it takes no place under
    the cap from a new job beside it.

    A job left out says only that it was not stored: ``submit_job`` then finds out why and
    answers as it always does. One statement instead of the lookup, the open-jobs count and
    the insert, for every job of the batch: one round trip and one commit, and the lookup can
    be skipped safely from a hint. A keyed job stored is let in or left waiting by the same
    statement, as ``submit_job`` stores one; its values say which.
    """
    rows = [_batch_row(ord_, job) for ord_, job in enumerate(jobs)]
    cursor = await conn.execute(
        _INSERT_JOBS_IF_RESOLVED, {"jobs": Jsonb(rows), "cap": open_jobs_limit}
    )
    stored = {row[0]: row[1:] for row in await cursor.fetchall()}
    for job in jobs:
        if job.id in stored:
            job.values.update(zip(("waiting_for", "dispatched_at"), stored[job.id], strict=True))
            metrics.JOBS_SUBMITTED.labels(job.values["pipeline"], job.values["trigger"]).inc()
    return set(stored)


async def plan_once(conn: psycopg.AsyncConnection[Any]) -> None:
    """Has ``conn`` plan the intake statement once, not for every batch. PostgreSQL plans a
    prepared statement again for each execution's parameters while that plan looks cheaper
    than a generic one, and for this statement it always does, since a custom plan folds the
    open-jobs cap away: that planning was 0.6 of the 1.4 ms the statement took for one job.
    The generic plan is made again when ANALYZE changes the statistics of a table it reads.
    Not for a connection through a transaction pooler: nothing is prepared there, and a
    setting of its session would reach other clients."""
    await conn.execute("SET plan_cache_mode = force_generic_plan")


def _batch_row(ord_: int, job: NewJob) -> dict[str, Any]:
    values = job.values
    pipeline_id = values["pipeline_id"]
    seen = "" if pipeline_id is None else f"{pipeline_id} {values['pipeline_version']}"
    row = {column: _json_value(values[column]) for column in JOB_COLUMNS}
    row.update(ord=ord_, name=job.name, seen=seen, steps=job.steps, **audit_columns(job.audit))
    row["profile"] = values["profile"]
    row["dedupe_since"] = _json_value(job.dedupe_since)
    return row


def _json_value(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return value
