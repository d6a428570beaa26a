"""Step state transitions in PostgreSQL: claim, checkpoint, fail, skip, release.

The common path is two autocommitted statements per step (``fast_claim``, ``complete_step``)
whose WHERE clauses carry the rules; every other transition runs in the caller's transaction
and locks the step row it changes. Either way, two deliveries of the same message cannot both
run a step, and a checkpoint is written once. Every transition that settles a step also takes
it off its children's ``waiting_on`` and hands back the children it was the last upstream of,
for the caller to send once it has committed. A for_each step's shards, which are step rows
too, come and go in ``service.engine.shards``.

Claiming is in ``claims``, settling in ``completion``; this module holds what both share: step
keys and leases, the outcomes they hand back, the SQL that takes a lease (which a claim, a
lane and a checkpoint that takes its only child all use), row locks, and releasing children.
"""

import uuid
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.language.plan import JobPlan, steps_plan
from service.language.profiles import Profile
from service.language.snapshots import step_facts
from service.language.specs import RetryPolicy, StepSpec
from service.platform.constants import SHARD_NONE
from service.platform.db import driver
from service.platform.errors import StopChain
from service.platform.models import JobRow, StepRunRow
from service.platform.states import (
    StepStatus,
)


@dataclass(frozen=True)
class StepKey:
    job_id: uuid.UUID
    step_id: str
    shard: int = SHARD_NONE


@dataclass(frozen=True)
class Lease:
    token: str
    attempt: int


@dataclass(frozen=True)
class Claimed:
    """A step this worker now holds: run ``action`` with ``inputs``."""

    key: StepKey
    lease: Lease
    action: str
    inputs: dict[str, Any]
    params: dict[str, Any]
    retry: RetryPolicy
    sink: bool
    profile: Profile
    trigger: dict[str, Any] = field(default_factory=dict)
    """What ``trigger.*`` reads, loaded for a step that reads it (its verify rules too)."""


@dataclass(frozen=True)
class Unresolvable:
    """The step's references cannot resolve; it was failed for good in the same transaction."""

    key: StepKey
    job_over: bool
    ready: JobPlan


@dataclass(frozen=True)
class Skipped:
    """The step settled without running (its upstream rule said so); send ``ready`` next."""

    key: StepKey
    ready: JobPlan


@dataclass(frozen=True)
class Completion:
    """A checkpointed attempt: whether it was written, the children it made ready, and the
    trigger of the job it succeeded, if it did. ``taken`` is the child the same statement
    claimed for this worker to run next (``Follow``); it is not in ``ready``."""

    written: bool
    ready: JobPlan
    succeeded_trigger: str | None = None
    taken: "Taken | None" = None


@dataclass(frozen=True)
class Taken:
    """The child a checkpoint claimed (``Follow``), and the outputs its inputs read."""

    key: StepKey
    lease: Lease
    outputs: dict[str, Any]


@dataclass(frozen=True)
class Follow:
    """Claim ``step_id``, a child whose only upstream is the step being checkpointed, in the
    checkpoint's statement, for the same worker to run next without a message."""

    step_id: str
    task_id: str
    lease_s: float


@dataclass(frozen=True)
class FanOutDue:
    """A for_each step this transaction holds; ``shards.fan_out`` records its shards before the
    transaction ends, on the rows locked here."""

    job: JobRow
    row: StepRunRow
    spec: StepSpec


def _lock_step(session: Session, key: StepKey) -> StepRunRow:
    row = session.scalars(
        select(StepRunRow)
        .where(
            StepRunRow.job_id == key.job_id,
            StepRunRow.step_id == key.step_id,
            StepRunRow.shard == key.shard,
        )
        .with_for_update()
    ).one_or_none()
    if row is None:
        raise StopChain(f"no step {key}")
    return row


_TAKE_LEASE = f"""status = '{StepStatus.RUNNING}', attempts = s.attempts + 1,
               lease_token = %(token)s,
               lease_until = %(until)s, task_id = %(task_id)s, started_at = %(now)s,
               error = NULL"""
_INPUT_OUTPUTS = """(SELECT coalesce(jsonb_object_agg(k.step_id, k.output), '{}'::jsonb)
              FROM step_checkpoints AS k
             WHERE k.job_id = %(job_id)s AND k.shard = -1
               AND k.step_id = ANY(c.inputs_from))"""
"""The outputs of the steps a claimed row reads (its ``inputs_from``), by step id."""

_RELEASE_CHILDREN = """
    UPDATE step_runs SET waiting_on = waiting_on - 1
     WHERE job_id = %(job_id)s AND step_id = ANY(%(children)s) AND shard = -1
    RETURNING step_id, waiting_on
    """


def release_children(session: Session, key: StepKey, profile: Profile) -> JobPlan:
    """Count a settled step off its children; the ones it was the last upstream of are ready.

    Runs in the transaction that settled the step, so it happens once per settling.
    """
    children = step_facts(profile, key.step_id).children
    if not children or key.shard != SHARD_NONE:
        return JobPlan(key.job_id)
    rows = driver(session).execute(
        _RELEASE_CHILDREN, {"job_id": key.job_id, "children": list(children)}
    )
    return steps_plan(profile, key.job_id, (step for step, left in rows if left == 0))


def holds_lease(row: StepRunRow, lease: Lease) -> bool:
    return row.status == StepStatus.RUNNING and row.lease_token == lease.token
