"""The checkpoint writer: every step's output (``step_runs.output``) is written here, once, by
the holder of the step's lease; the reads of what checkpoints hold sit beside it.

On the common path a step's checkpoint is one autocommitted statement (``complete_step``)
whose update settles the step and writes its output in the same row version (ADR 28). The
statement also counts the step off its children and, where it may, claims the child that
follows or succeeds the job, and appends the events of those changes (``inline_events``); its
WHERE clause carries the rules, so a redelivered message that finds the step settled writes
nothing and counts nothing twice. A checkpoint that a transaction must decide on (a loop's
round, a fan-out's gathered items) is written in that transaction (``write_checkpoint``); a
rerun copies its parent's (``copy_checkpoints``). A step that declares ``cache`` runs a variant
of the same statement that also writes its row of the step cache (``_with_cache_row``,
ADR 17); every other step's statement is as it was.
"""

import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.engine.inline_events import (
    RETURNS_JOB,
    dependents,
    job_event,
    logged,
    mark,
    step_event,
)
from service.engine.leases import TAKE_LEASE, take_next_shard
from service.engine.steps import (
    CacheWrite,
    Completion,
    Flushed,
    Follow,
    Lease,
    ShardClaim,
    ShardDone,
    StepKey,
    Taken,
)
from service.language.plan import steps_plan
from service.language.profiles import Profile
from service.language.snapshots import step_facts
from service.platform.constants import SHARD_NONE
from service.platform.db import driver
from service.platform.models import StepRunRow
from service.platform.states import (
    JOB_OPEN_SQL,
    STEP_DUE_SQL,
    JobStatus,
    StepStatus,
    row_test,
    sql_in,
)

INPUT_OUTPUTS = """(SELECT coalesce(jsonb_object_agg(k.step_id, k.output), '{}'::jsonb)
              FROM step_runs AS k
             WHERE k.job_id = %(job_id)s AND k.shard = -1
               AND k.step_id = ANY(c.inputs_from) AND k.output IS NOT NULL)"""
"""The outputs of the steps a row ``c`` that a claim statement took reads (its ``inputs_from``),
by step id, read in the claim's own statement."""


def step_outputs(session: Session, job_id: uuid.UUID, step_ids: set[str]) -> dict[str, Any]:
    if not step_ids:
        return {}
    rows = session.execute(
        select(StepRunRow.step_id, StepRunRow.output).where(
            StepRunRow.job_id == job_id,
            StepRunRow.shard == SHARD_NONE,
            StepRunRow.step_id.in_(step_ids),
            StepRunRow.output.is_not(None),
        )
    )
    return {step_id: output for step_id, output in rows}


_SUCCEEDED_OR_SKIPPED = sql_in(
    (StepStatus.SUCCEEDED, StepStatus.REUSED, StepStatus.CACHED, StepStatus.SKIPPED)
)
_DONE = "RETURNING job_id, step_id, attempts, round\n    )"


def _completed(*, inline: bool) -> str:
    """The CTE ``done`` of a statement that checkpoints an attempt: the step settled with its
    output if the lease is still this attempt's. With ``inline``, the statement appends its
    changes' events itself (``inline_events``)."""
    return f"""
    WITH done AS (
        UPDATE step_runs
           SET status = '{StepStatus.SUCCEEDED}', finished_at = %(now)s, lease_token = NULL,
               lease_until = NULL, output = %(output)s{", " + mark("step_runs") if inline else ""}
         WHERE job_id = %(job_id)s AND step_id = %(step_id)s AND shard = %(shard)s
           AND status = '{StepStatus.RUNNING}' AND lease_token = %(token)s
        {_DONE}"""


_STEP_SUCCEEDED = step_event(1, StepStatus.SUCCEEDED, "done")
_COMPLETE = (
    _completed(inline=True)
    + f""", released AS (
        UPDATE step_runs SET waiting_on = waiting_on - 1
         WHERE job_id = %(job_id)s AND step_id = ANY(%(children)s) AND shard = -1
           AND EXISTS (SELECT 1 FROM done)
        RETURNING step_id, waiting_on
    ), {logged(_STEP_SUCCEEDED)}
    SELECT EXISTS (SELECT 1 FROM done),
           ARRAY(SELECT step_id FROM released WHERE waiting_on = 0), NULL::text"""
)
"""The checkpoint, and the step counted off its children in the same statement, so a
redelivered message that finds the step settled cannot count it twice."""
_COMPLETE_SHARD = (
    _completed(inline=False) + " SELECT EXISTS (SELECT 1 FROM done), ARRAY[]::text[], NULL::text"
)
"""A shard's checkpoint, when its lane takes no next shard: a shard's change is no step's
event (the log reports a fan-out's progress in batches, by trigger), so nothing is logged."""
_COMPLETE_AND_TAKE = (
    _completed(inline=True)
    + f""", claimed AS (
        UPDATE step_runs AS s
           SET waiting_on = 0, {TAKE_LEASE.replace("%(token)s", "%(taken_token)s")}, {mark("s")}
          FROM jobs AS j
         WHERE s.job_id = %(job_id)s AND s.step_id = %(take)s AND s.shard = -1
           AND s.waiting_on = 1 AND s.status IN {STEP_DUE_SQL}
           AND j.id = s.job_id AND {row_test(f"j.status IN {JOB_OPEN_SQL}")}
           AND EXISTS (SELECT 1 FROM done)
        RETURNING s.step_id, s.attempts, s.round, s.inputs_from
    ), released AS (
        UPDATE step_runs SET waiting_on = waiting_on - 1
         WHERE job_id = %(job_id)s AND step_id = ANY(%(children)s) AND shard = -1
           AND EXISTS (SELECT 1 FROM done)
           AND NOT (step_id = %(take)s AND EXISTS (SELECT 1 FROM claimed))
        RETURNING step_id, waiting_on
    ), {logged(_STEP_SUCCEEDED, step_event(2, StepStatus.RUNNING, "claimed"))}
    SELECT EXISTS (SELECT 1 FROM done),
           ARRAY(SELECT step_id FROM released WHERE waiting_on = 0), NULL::text,
           c.attempts,
           {INPUT_OUTPUTS}
           || CASE WHEN %(step_id)s = ANY(c.inputs_from)
                   THEN jsonb_build_object(%(step_id)s, %(output)s::jsonb)
                   ELSE '{{}}'::jsonb END
      FROM (SELECT 1) AS one LEFT JOIN claimed AS c ON true"""
)
"""The checkpoint and the claim of the child that ``Follow`` names, when this step was its
only upstream, in one statement: what ``claims.fast_claim`` would have done a message later,
under the same conditions. Every other child is counted off as in ``_COMPLETE``. The child
reads this step's output from the statement's parameter, since the statement's own update of
this step's row is not visible to the statement's reads."""
_COMPLETE_AND_SUCCEED_JOB = (
    _completed(inline=True)
    + f""", succeeded AS (
        UPDATE jobs
           SET status = '{JobStatus.SUCCEEDED}', finished_at = %(now)s, result = %(result)s,
               {mark("jobs")}
         WHERE id = %(job_id)s
           AND {row_test(f"status IN {sql_in((JobStatus.QUEUED, JobStatus.RUNNING))}")}
           AND EXISTS (SELECT 1 FROM done)
           AND NOT EXISTS (
               SELECT 1 FROM step_runs
                WHERE job_id = %(job_id)s AND shard = -1 AND step_id <> %(step_id)s
                  AND status NOT IN {_SUCCEEDED_OR_SKIPPED})
        RETURNING {RETURNS_JOB}
    ), {dependents("succeeded")},
       {logged(_STEP_SUCCEEDED, job_event(2, JobStatus.SUCCEEDED, "succeeded"))}
    SELECT EXISTS (SELECT 1 FROM done), ARRAY[]::text[], (SELECT trigger FROM succeeded)"""
)


_COMPLETE_SHARD_AND_TAKE = (
    _completed(inline=False)
    + f""", {take_next_shard("%(taken_token)s", " AND EXISTS (SELECT 1 FROM done)")}
    SELECT EXISTS (SELECT 1 FROM done), c.shard, c.attempts, c.item,
           {INPUT_OUTPUTS}
      FROM (SELECT 1) AS one LEFT JOIN claimed AS c ON true"""
)
"""A shard's checkpoint and the claim of the lane's next shard in one statement and one
commit: what the lane's next claim statement would have done, under the same conditions,
once this checkpoint is written."""

_NEXT_BEYOND_BATCH = take_next_shard(
    "%(taken_token)s", " AND shard <> ALL(%(shards)s::int[]) AND EXISTS (SELECT 1 FROM done)"
)
_COMPLETE_SHARDS_AND_TAKE = f"""
    WITH batch AS (
        SELECT * FROM unnest(%(shards)s::int[], %(outputs)s::jsonb[],
                             %(started)s::timestamptz[], %(finished)s::timestamptz[])
                   AS b(shard, output, started_at, finished_at)
    ), done AS (
        UPDATE step_runs AS s
           SET status = '{StepStatus.SUCCEEDED}', started_at = b.started_at,
               finished_at = b.finished_at, lease_token = NULL, lease_until = NULL,
               output = b.output
          FROM batch AS b
         WHERE s.job_id = %(job_id)s AND s.step_id = %(step_id)s AND s.shard = b.shard
           AND s.status = '{StepStatus.RUNNING}' AND s.lease_token = %(token)s
        RETURNING s.shard
    ), {_NEXT_BEYOND_BATCH}
    SELECT (SELECT count(*) FROM done), c.shard, c.attempts, c.item, {INPUT_OUTPUTS}
      FROM (SELECT 1) AS one LEFT JOIN claimed AS c ON true
     ORDER BY c.shard"""
"""A lane's batch of shards (``ShardDone``) checkpointed in one statement and one commit: each
row settled with its output and the times its own attempt began and ended, and the lane's
next shards taken with them, as ``_COMPLETE_SHARD_AND_TAKE`` does for one shard. A shard whose
lease was lost meanwhile is not written; the next shards exclude the batch's own."""

_SETTLED = f"SET status = '{StepStatus.SUCCEEDED}', finished_at = %(now)s, lease_token"
_STEP_CACHED = step_event(
    1,
    StepStatus.CACHED,
    "done",
    "jsonb_build_object('cached_from', jsonb_build_object("
    "'job_id', %(source_job)s::text, 'step_id', %(source_step)s::text))",
)


def _once(statement: str, old: str, new: str) -> str:
    assert statement.count(old) == 1, old
    return statement.replace(old, new)


def _with_cache_row(statement: str, *, use: bool) -> str:
    """``statement`` for a step that declares ``cache`` (``steps.CacheWrite``): the same
    statement, which also writes the step's row of ``step_cache`` once its checkpoint is
    saved; for a ``use``, the step settles ``cached`` and its event names the source. The
    statements of every other step stay as they are."""
    sources = "%(source_job)s, %(source_step)s, %(source_shard)s" if use else "NULL, NULL, NULL"
    row = f""", cache_row AS (
        INSERT INTO step_cache (job_id, step_id, shard, owner, cache_key, created_at,
                                source_job_id, source_step_id, source_shard)
        SELECT job_id, %(step_id)s, %(shard)s, %(owner)s, %(cache_key)s, %(now)s, {sources}
          FROM done
        ON CONFLICT DO NOTHING
    )"""
    written = _once(statement, _DONE, _DONE + row)
    if not use:
        return written
    cached = _once(written, _SETTLED, _SETTLED.replace(StepStatus.SUCCEEDED, StepStatus.CACHED))
    return cached.replace(_STEP_SUCCEEDED, _STEP_CACHED)


_CACHE_VARIANTS = {
    (plain, use): _with_cache_row(plain, use=use)
    for plain in (
        _COMPLETE,
        _COMPLETE_SHARD,
        _COMPLETE_AND_TAKE,
        _COMPLETE_AND_SUCCEED_JOB,
        _COMPLETE_SHARD_AND_TAKE,
    )
    for use in (False, True)
}


def _cached(plain: str, params: dict[str, Any], cache: CacheWrite | None) -> str:
    """The statement to run for ``plain``, with ``cache``'s parameters bound into ``params``."""
    if cache is None:
        return plain
    job, step, shard = cache.source or (None, None, None)
    params |= {
        "owner": cache.owner,
        "cache_key": cache.key,
        "source_job": job,
        "source_step": step,
        "source_shard": shard,
    }
    return _CACHE_VARIANTS[(plain, cache.source is not None)]


def _checkpoint(key: StepKey, lease: Lease, output: Any, now: datetime) -> dict[str, Any]:
    """What every checkpointing statement binds: the attempt, its lease and its output."""
    return {
        "now": now,
        "job_id": key.job_id,
        "step_id": key.step_id,
        "shard": key.shard,
        "token": lease.token,
        "output": Jsonb(output),
    }


def complete_step(
    conn: psycopg.Connection[Any],
    key: StepKey,
    lease: Lease,
    output: Any,
    now: datetime,
    *,
    profile: Profile,
    succeeds_job: bool = False,
    follow: Follow | None = None,
    cache: CacheWrite | None = None,
) -> Completion:
    """Checkpoint a finished attempt in one statement, unless its lease was lost meanwhile.

    With ``succeeds_job`` (the job's sole sink, whose output is the job's result, see
    ``settle.sink_settles_job``) the same statement succeeds the job; a sink has no children.
    With ``follow`` it also claims that child for the caller. With ``cache`` it writes the
    step's row of the step cache, and for an output the cache gave settles the step ``cached``.
    """
    params = _checkpoint(key, lease, output, now)
    if succeeds_job:
        params["result"] = Jsonb({key.step_id: output})
    else:
        children = step_facts(profile, key.step_id).children if key.shard == SHARD_NONE else ()
        params["children"] = list(children)
    if follow is not None and not succeeds_job:
        return _complete_and_take(conn, key, params, profile, follow, cache)
    if succeeds_job:
        statement = _COMPLETE_AND_SUCCEED_JOB
    else:
        statement = _COMPLETE if key.shard == SHARD_NONE else _COMPLETE_SHARD
    row = conn.execute(_cached(statement, params, cache), params).fetchone()
    assert row is not None
    written, ready, succeeded_trigger = row
    return Completion(written, steps_plan(profile, key.job_id, ready), succeeded_trigger)


def _complete_and_take(
    conn: psycopg.Connection[Any],
    key: StepKey,
    params: dict[str, Any],
    profile: Profile,
    follow: Follow,
    cache: CacheWrite | None,
) -> Completion:
    child = StepKey(key.job_id, follow.step_id)
    token = uuid.uuid4().hex
    params |= {
        "take": follow.step_id,
        "taken_token": token,
        "until": params["now"] + timedelta(seconds=follow.lease_s),
        "task_id": follow.task_id,
    }
    row = conn.execute(_cached(_COMPLETE_AND_TAKE, params, cache), params).fetchone()
    assert row is not None
    written, ready, _, attempts, outputs = row
    taken = None if attempts is None else Taken(child, Lease(token, attempts), outputs)
    return Completion(written, steps_plan(profile, key.job_id, ready), None, taken)


def complete_shard_and_take(
    conn: psycopg.Connection[Any],
    key: StepKey,
    lease: Lease,
    output: Any,
    now: datetime,
    *,
    profile: Profile,
    task_id: str,
    lease_s: float,
    cache: CacheWrite | None = None,
) -> Completion:
    """Checkpoint a shard as ``complete_step`` does, and take the lane's next open shard in
    the same statement; ``next_shard`` is ``None`` when none is left to this lane."""
    token = uuid.uuid4().hex
    params = _checkpoint(key, lease, output, now) | _taking(token, 1, now, task_id, lease_s)
    row = conn.execute(_cached(_COMPLETE_SHARD_AND_TAKE, params, cache), params).fetchone()
    assert row is not None
    written, shard, attempts, item, outputs = row
    taken = None
    if shard is not None:
        shard_key = StepKey(key.job_id, key.step_id, shard)
        taken = ShardClaim(shard_key, Lease(token, attempts), profile, item, outputs)
    return Completion(written, steps_plan(profile, key.job_id, []), None, next_shard=taken)


def complete_shards_and_take(
    conn: psycopg.Connection[Any],
    parent: StepKey,
    batch: Sequence[ShardDone],
    now: datetime,
    *,
    take: int,
    profile: Profile,
    task_id: str,
    lease_s: float,
) -> Flushed:
    """Checkpoint a lane's batch, held under one lease token, and take up to ``take`` next
    shards in the same statement, as ``complete_shard_and_take`` does for one."""
    token = uuid.uuid4().hex
    params = {
        "job_id": parent.job_id,
        "step_id": parent.step_id,
        "token": batch[0].lease.token,
        "shards": [done.key.shard for done in batch],
        "outputs": [Jsonb(done.output) for done in batch],
        "started": [done.started_at for done in batch],
        "finished": [done.finished_at for done in batch],
    } | _taking(token, take, now, task_id, lease_s)
    rows = conn.execute(_COMPLETE_SHARDS_AND_TAKE, params).fetchall()
    taken = [
        (shard, attempts, item, outputs)
        for _, shard, attempts, item, outputs in rows
        if shard is not None
    ]
    return Flushed(int(rows[0][0]), ShardClaim.batch(parent, token, profile, taken))


def _taking(token: str, take: int, now: datetime, task_id: str, lease_s: float) -> dict[str, Any]:
    """What a statement that takes a lane's next shards binds for their lease."""
    return {
        "taken_token": token,
        "take": take,
        "now": now,
        "until": now + timedelta(seconds=lease_s),
        "task_id": task_id,
    }


_WRITE = """
    UPDATE step_runs SET output = %(output)s
     WHERE job_id = %(job_id)s AND step_id = %(step_id)s AND shard = %(shard)s
       AND output IS NULL"""


def write_checkpoint(session: Session, key: StepKey, output: Any) -> None:
    """Checkpoint a step whose row the caller's transaction holds and settles itself: a second
    version of the row, on paths that decide in a transaction (a loop's round, a gather)."""
    values = {"job_id": key.job_id, "step_id": key.step_id, "shard": key.shard}
    driver(session).execute(_WRITE, values | {"output": Jsonb(output)})


_COPY = """
    UPDATE step_runs AS s SET output = p.output
      FROM step_runs AS p
     WHERE s.job_id = %(job)s AND s.shard = -1 AND s.step_id = ANY(%(steps)s)
       AND p.job_id = %(parent)s AND p.step_id = s.step_id AND p.shard = -1
       AND p.output IS NOT NULL"""


def copy_checkpoints(
    conn: psycopg.Connection[Any], parent_id: uuid.UUID, job_id: uuid.UUID, steps: Iterable[str]
) -> None:
    """Give a rerun's reused steps their parent's checkpoints; its reused shards are inserted
    with theirs (``reruns``)."""
    conn.execute(_COPY, {"job": job_id, "parent": parent_id, "steps": sorted(steps)})
