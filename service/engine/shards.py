"""A for_each step's shards: recorded when the step is claimed, taken in batches by lanes,
gathered into the step's output once all are settled.

A shard is a step row of its own (``shard`` >= 0), claimed (``claims.fast_shard_claims``), given
its inputs, checkpointed and failed like any step; what is here is how shards come to exist
and how the fan-out ends.
"""

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.engine.checkpoints import step_outputs, write_checkpoint
from service.engine.completion import unresolvable
from service.engine.leases import live_job, lock_step
from service.engine.loops import settle_succeeded
from service.engine.steps import Completion, FanOutDue, StepKey, Unresolvable
from service.language.expressions import ExprContext, resolve
from service.language.plan import JobPlan
from service.language.snapshots import job_profile, referenced_steps, step_facts
from service.language.specs import ForEach
from service.platform.db import driver
from service.platform.errors import ExpressionError, FanOutTooLarge, JobTooLarge, RetryLater
from service.platform.models import JobRow, StepRunRow
from service.platform.states import STEP_FINAL, StepStatus


@dataclass(frozen=True)
class FannedOut:
    """A for_each step whose shards are recorded; run them, then ``finish_fanout``."""

    key: StepKey
    shards: list[int]
    max_parallel: int
    timeout_s: int


_INSERT_SHARDS = f"""
    INSERT INTO step_runs (job_id, step_id, shard, status, attempts, item, depends_on, inputs_from)
    SELECT %(job_id)s, %(step_id)s::text, s.ordinality - 1, '{StepStatus.PENDING}', 0, s.item,
           '{{}}', %(inputs_from)s
      FROM jsonb_array_elements(%(items)s) WITH ORDINALITY AS s(item, ordinality)
     WHERE NOT EXISTS (SELECT 1 FROM step_runs AS e
                        WHERE e.job_id = %(job_id)s AND e.step_id = %(step_id)s::text
                          AND e.shard = s.ordinality - 1)
    """
"""One shard row per item, the items sent as one JSON array: a row of bound parameters per
item would pass PostgreSQL's limit of 65,535 parameters at a few thousand items. A rerun's
reused shards are there already and are skipped. Not ``ON CONFLICT``: its speculative insert
writes a confirm record a row, 48 WAL bytes a shard, and the transaction holds the step's row,
so no other fans it out meanwhile."""


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
        return unresolvable(session, row, key, exc, now)
    if not items:
        write_checkpoint(session, key, [])
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


def finish_fanout(session: Session, key: StepKey, now: datetime) -> JobPlan:
    """The chord body of a for_each step: gather shard outputs in item order."""
    job = live_job(session, key.job_id)
    row = lock_step(session, key)
    if row.status in STEP_FINAL:
        return JobPlan(key.job_id)
    if pending_shards(session, key):
        raise RetryLater(1.0, "shards are not settled")
    outputs = session.scalars(
        select(StepRunRow.output)
        .where(
            StepRunRow.job_id == key.job_id,
            StepRunRow.step_id == key.step_id,
            StepRunRow.shard >= 0,
            StepRunRow.output.is_not(None),
        )
        .order_by(StepRunRow.shard)
    )
    write_checkpoint(session, key, list(outputs))
    return settle_succeeded(session, row, job_profile(job), now)
