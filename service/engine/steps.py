"""Step state transitions in PostgreSQL: claim, checkpoint, fail, skip, release.

The common path is two autocommitted statements per step (``fast_claim``, ``complete_step``)
whose WHERE clauses carry the rules; every other transition runs in the caller's transaction
and locks the step row it changes. Either way, two deliveries of the same message cannot both
run a step, and a checkpoint is written once. Every transition that settles a step also takes
it off its children's ``waiting_on`` and hands back the children it was the last upstream of,
for the caller to send once it has committed. A for_each step's shards, which are step rows
too, come and go in ``service.engine.shards``.

Claiming is in ``claims``, settling in ``completion``; this module holds what both share: step
keys and leases, the outcomes they hand back, row locks, and releasing children.
"""

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.language.plan import JobPlan, steps_plan
from service.language.profiles import Profile
from service.language.snapshots import step_facts
from service.language.specs import RetryPolicy, StepSpec
from service.platform.constants import SHARD_NONE, WAIT_FOR_PEER_MAX_S
from service.platform.db import driver
from service.platform.errors import RetryLater, StopChain
from service.platform.models import JobRow, StepRunRow
from service.platform.states import (
    JOB_FINAL,
    JOB_OPEN_SQL,
    STEP_DUE_SQL,
    STEP_SUCCESSFUL_SQL,
    JobStatus,
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


def _live_job(session: Session, job_id: uuid.UUID) -> JobRow:
    job = session.get(JobRow, job_id)
    if job is None or job.status in JOB_FINAL:
        raise StopChain(f"job {job_id} is over")
    return job


def _wait_for_peer(row: StepRunRow, now: datetime) -> None:
    """Someone else holds this step: come back once their lease could have lapsed."""
    if row.status == StepStatus.RUNNING and (row.lease_until is None or row.lease_until > now):
        remaining = (row.lease_until - now).total_seconds() if row.lease_until else 1.0
        raise RetryLater(min(max(remaining, 0.2), WAIT_FOR_PEER_MAX_S), "held by a live lease")


def _upstream_statuses(session: Session, job_id: uuid.UUID, deps: list[str]) -> list[str]:
    if not deps:
        return []
    return list(
        session.scalars(
            select(StepRunRow.status).where(
                StepRunRow.job_id == job_id,
                StepRunRow.shard == SHARD_NONE,
                StepRunRow.step_id.in_(deps),
            )
        )
    )


def _take_lease(row: StepRunRow, job: JobRow, task_id: str, lease_s: float, now: datetime) -> Lease:
    row.status = StepStatus.RUNNING
    row.attempts += 1
    row.lease_token = uuid.uuid4().hex
    row.lease_until = now + timedelta(seconds=lease_s)
    row.task_id = task_id
    row.started_at = now
    row.error = None
    if job.status == JobStatus.QUEUED:
        job.status = JobStatus.RUNNING
        job.started_at = now
    return Lease(token=row.lease_token, attempt=row.attempts)


_TAKE_LEASE = f"""status = '{StepStatus.RUNNING}', attempts = s.attempts + 1,
               lease_token = %(token)s,
               lease_until = %(until)s, task_id = %(task_id)s, started_at = %(now)s,
               error = NULL"""
_INPUT_OUTPUTS = """(SELECT coalesce(jsonb_object_agg(k.step_id, k.output), '{}'::jsonb)
              FROM step_checkpoints AS k
             WHERE k.job_id = %(job_id)s AND k.shard = -1
               AND k.step_id = ANY(c.inputs_from))"""
"""The outputs of the steps a claimed row reads (its ``inputs_from``), by step id."""

_FAST_CLAIM = f"""
    WITH claimed AS (
        UPDATE step_runs AS s
           SET {_TAKE_LEASE}
          FROM jobs AS j
         WHERE s.job_id = %(job_id)s AND s.step_id = %(step_id)s AND s.shard = -1
           AND j.id = s.job_id AND j.status IN {JOB_OPEN_SQL}
           AND (s.status IN {STEP_DUE_SQL}
                OR (s.status = '{StepStatus.RUNNING}' AND s.lease_until < %(now)s))
           AND NOT EXISTS (
               SELECT 1 FROM step_runs AS u
                WHERE u.job_id = s.job_id AND u.shard = -1
                  AND u.step_id = ANY(s.depends_on)
                  AND u.status NOT IN {STEP_SUCCESSFUL_SQL})
        RETURNING s.attempts, s.inputs_from, j.profile_hash, j.params
    ), started AS (
        UPDATE jobs SET status = '{JobStatus.RUNNING}', started_at = %(now)s
         WHERE id = %(job_id)s AND status = '{JobStatus.QUEUED}' AND EXISTS (SELECT 1 FROM claimed)
    )
    SELECT c.attempts, c.profile_hash, c.params,
           {_INPUT_OUTPUTS} AS outputs
      FROM claimed AS c
    """


def _lease_params(key: StepKey, task_id: str, lease_s: float, now: datetime) -> dict[str, Any]:
    """The parameters of a one-statement claim: a fresh lease token, and whose it is."""
    return {
        "token": uuid.uuid4().hex,
        "until": now + timedelta(seconds=lease_s),
        "task_id": task_id,
        "now": now,
        "job_id": key.job_id,
        "step_id": key.step_id,
    }


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
