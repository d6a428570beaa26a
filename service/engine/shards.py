"""A for_each step's shards: recorded when the step is claimed, taken one by one by lanes,
gathered into the step's output once all are settled.

A shard is a step row of its own (``shard`` >= 0), claimed, checkpointed and failed through
``service.engine.steps`` like any step; what is here is how shards come to exist, how a lane
finds the next open one, and how the fan-out ends.
"""

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from service.engine.claims import (
    Held,
    _claim_of,
    _claimed,
    _job_json,
    _lease_params,
    _live_job,
    _profile_json,
)
from service.engine.completion import _record_failure
from service.engine.loops import settle_succeeded
from service.engine.settle import step_outputs
from service.engine.steps import (
    _INPUT_OUTPUTS,
    _TAKE_LEASE,
    Claimed,
    Completion,
    FanOutDue,
    Lease,
    StepKey,
    Unresolvable,
    _lock_step,
)
from service.language.expressions import ExprContext, resolve
from service.language.plan import JobPlan
from service.language.profiles import Profile
from service.language.snapshots import cached_profile, job_profile, referenced_steps, step_facts
from service.language.specs import ForEach
from service.platform.db import driver
from service.platform.errors import ExpressionError, FanOutTooLarge, JobTooLarge, RetryLater
from service.platform.models import OPEN_SHARD_PREDICATE, CheckpointRow, JobRow, StepRunRow
from service.platform.states import STEP_DUE_SQL, STEP_FINAL, JobStatus, StepStatus, sql_in


@dataclass(frozen=True)
class FannedOut:
    """A for_each step whose shards are recorded; run them, then ``finish_fanout``."""

    key: StepKey
    shards: list[int]
    max_parallel: int
    timeout_s: int


_INSERT_SHARDS = f"""
    INSERT INTO step_runs (job_id, step_id, shard, status, attempts, item, depends_on, inputs_from)
    SELECT %(job_id)s, %(step_id)s, s.ordinality - 1, '{StepStatus.PENDING}', 0, s.item, '{{}}',
           %(inputs_from)s
      FROM jsonb_array_elements(%(items)s) WITH ORDINALITY AS s(item, ordinality)
    ON CONFLICT DO NOTHING
    """
"""One shard row per item, the items sent as one JSON array: a row of bound parameters per
item would pass PostgreSQL's limit of 65,535 parameters at a few thousand items."""


def fan_out(
    session: Session, due: FanOutDue, now: datetime, *, max_items: int, max_job_steps: int
) -> FannedOut | Unresolvable | Completion:
    """Record a held for_each step's shards, one per item, in the transaction that claimed it.

    With no items the step succeeds at once with an empty list. Items that do not resolve to a
    list, more than ``max_items`` of them, or enough to take the job past ``max_job_steps``
    step rows, fail the step for good like unresolvable input.
    """
    job, row, spec = due.job, due.row, due.spec
    assert spec.for_each is not None
    key = StepKey(job.id, spec.id)
    try:
        items = _items(session, job, spec.id, spec.for_each)
        if len(items) > max_items:
            raise FanOutTooLarge(
                f"step {spec.id!r} fans out over {len(items)} items, the limit is {max_items}",
                {"items": len(items), "limit": max_items},
            )
        _within_job_limit(session, job.id, spec.id, len(items), max_job_steps)
    except (ExpressionError, FanOutTooLarge, JobTooLarge) as exc:
        error = {"code": exc.code, "message": exc.message, "details": exc.details}
        failed = _record_failure(session, row, key, error, None, now)
        return Unresolvable(key, failed.job_over, failed.ready)
    if not items:
        _write_checkpoint(session, key, row.attempts, [])
        return Completion(True, settle_succeeded(session, row, job_profile(job), now))
    driver(session).execute(
        _INSERT_SHARDS,
        {
            "job_id": job.id,
            "step_id": spec.id,
            "items": Jsonb(items),
            "inputs_from": sorted(step_facts(job_profile(job), spec.id).referenced),
        },
    )
    row.lease_until = None
    return FannedOut(
        key=key,
        shards=pending_shards(session, key),
        max_parallel=spec.for_each.max_parallel,
        timeout_s=spec.timeout_s,
    )


def _within_job_limit(
    session: Session, job_id: uuid.UUID, step_id: str, items: int, max_job_steps: int
) -> None:
    held = session.scalar(select(func.count()).where(StepRunRow.job_id == job_id)) or 0
    if held + items > max_job_steps:
        raise JobTooLarge(
            f"step {step_id!r} would take its job to {held + items} steps with its items, "
            f"the limit is {max_job_steps}",
            {"steps": held + items, "limit": max_job_steps},
        )


def _items(session: Session, job: JobRow, step_id: str, for_each: ForEach) -> list[Any]:
    outputs = step_outputs(session, job.id, referenced_steps(for_each.items))
    context = ExprContext(params=job.params, outputs=outputs, trigger=job.trigger_data or {})
    items = resolve(for_each.items, context)
    if not isinstance(items, list):
        raise ExpressionError(
            f"for_each.items of step {step_id!r} is not a list",
            {"expression": for_each.items, "reason": f"got {type(items).__name__}"},
        )
    return items


def pending_shards(session: Session, key: StepKey) -> list[int]:
    return list(
        session.scalars(
            select(StepRunRow.shard)
            .where(
                StepRunRow.job_id == key.job_id,
                StepRunRow.step_id == key.step_id,
                StepRunRow.shard >= 0,
                StepRunRow.status.not_in(list(STEP_FINAL)),
            )
            .order_by(StepRunRow.shard)
        )
    )


_FAST_SHARD_CLAIM = f"""
    WITH next AS (
        SELECT id FROM step_runs
         WHERE job_id = %(job_id)s AND step_id = %(step_id)s AND {OPEN_SHARD_PREDICATE}
           AND (status IN {STEP_DUE_SQL} OR lease_until < %(now)s)
         ORDER BY shard
         LIMIT 1
         FOR UPDATE SKIP LOCKED
    ), claimed AS (
        UPDATE step_runs AS s
           SET {_TAKE_LEASE}
          FROM next, jobs AS j
         WHERE s.id = next.id AND j.id = s.job_id
           AND j.status IN {sql_in((JobStatus.RUNNING, JobStatus.AWAITING_APPROVAL))}
        RETURNING s.shard, s.attempts, s.item, s.inputs_from, j.profile_hash
    )
    SELECT c.shard, c.attempts, c.item, c.profile_hash,
           {_INPUT_OUTPUTS} AS outputs
      FROM claimed AS c
    """


@dataclass(frozen=True)
class ShardClaim:
    key: StepKey
    lease: Lease
    profile: Profile
    item: Any
    outputs: dict[str, Any]


def fast_shard_claim(
    conn: psycopg.Connection[Any], parent: StepKey, *, task_id: str, lease_s: float, now: datetime
) -> ShardClaim | None:
    """The next open shard of a fan-out in one autocommitted statement.

    ``None`` when no shard is open to this lane, or the job is over (``no_shard_left``).
    """
    params = _lease_params(parent, task_id, lease_s, now)
    token = params["token"]
    row = conn.execute(_FAST_SHARD_CLAIM, params).fetchone()
    if row is None:
        return None
    shard, attempts, item, profile_hash, outputs = row
    profile = cached_profile(profile_hash, lambda: _profile_json(conn, parent.job_id))
    key = StepKey(parent.job_id, parent.step_id, shard)
    return ShardClaim(key, Lease(token, attempts), profile, item, outputs)


def job_params(conn: psycopg.Connection[Any], job_id: uuid.UUID) -> dict[str, Any]:
    """Read once per lane message: a job's params never change, and may be large."""
    return _job_json(conn, "SELECT params FROM jobs WHERE id = %s", job_id)


def ready_shard(claim: ShardClaim, params: dict[str, Any]) -> Claimed | None:
    """A fast shard claim as work to run, with no further statement; ``None`` when its inputs
    do not resolve and the failure must be recorded in a transaction (``use_shard_claim``),
    or when they read a decision, which only a transaction reads."""
    facts = step_facts(claim.profile, claim.key.step_id)
    if facts.decisions or facts.reads_loop:
        return None
    try:
        return _claim_of(_held(claim, params), claim.outputs)
    except ExpressionError:
        return None


def use_shard_claim(
    session: Session, claim: ShardClaim, params: dict[str, Any], now: datetime
) -> Claimed | Unresolvable:
    return _claimed(session, _held(claim, params), now)


def _held(claim: ShardClaim, params: dict[str, Any]) -> Held:
    return Held(claim.key, claim.lease, claim.profile, params, claim.outputs, claim.item)


def no_shard_left(session: Session, parent: StepKey) -> None:
    """Why ``fast_shard_claim`` took nothing: every open shard is held by another lane or
    settled, or the job is over, which raises ``StopChain``."""
    _live_job(session, parent.job_id)


def finish_fanout(session: Session, key: StepKey, now: datetime) -> JobPlan:
    """The chord body of a for_each step: gather shard outputs in item order."""
    job = _live_job(session, key.job_id)
    row = _lock_step(session, key)
    if row.status in STEP_FINAL:
        return JobPlan(key.job_id)
    if pending_shards(session, key):
        raise RetryLater(1.0, "shards are not settled")
    outputs = session.scalars(
        select(CheckpointRow.output)
        .where(
            CheckpointRow.job_id == key.job_id,
            CheckpointRow.step_id == key.step_id,
            CheckpointRow.shard >= 0,
        )
        .order_by(CheckpointRow.shard)
    )
    _write_checkpoint(session, key, row.attempts, list(outputs))
    return settle_succeeded(session, row, job_profile(job), now)


def _write_checkpoint(session: Session, key: StepKey, attempt: int, output: Any) -> None:
    session.execute(
        insert(CheckpointRow)
        .values(
            job_id=key.job_id,
            step_id=key.step_id,
            shard=key.shard,
            attempt=attempt,
            output=output,
        )
        .on_conflict_do_nothing()
    )
