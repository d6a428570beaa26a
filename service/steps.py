"""Step state transitions in PostgreSQL: claim, checkpoint, fail, skip, release.

The common path is two autocommitted statements per step (``fast_claim``, ``complete_step``)
whose WHERE clauses carry the rules; every other transition runs in the caller's transaction
and locks the step row it changes. Either way, two deliveries of the same message cannot both
run a step, and a checkpoint is written once. Every transition that settles a step also takes
it off its children's ``waiting_on`` and hands back the children it was the last upstream of,
for the caller to send once it has committed. A for_each step's shards, which are step rows
too, come and go in ``service.shards``.
"""

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, LiteralString

import psycopg
from psycopg.types.json import Jsonb
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from service.compensations import record_compensations
from service.gates import approved, decisions
from service.language.conditions import evaluate
from service.language.expressions import ExprContext, resolve
from service.language.plan import JobPlan, steps_plan
from service.language.profiles import Profile
from service.language.snapshots import cached_profile, job_profile, step_facts
from service.language.specs import RetryPolicy, StepSpec
from service.platform import metrics
from service.platform.constants import SHARD_NONE, WAIT_FOR_PEER_MAX_S
from service.platform.db import driver
from service.platform.errors import ExpressionError, RetryLater, StopChain
from service.platform.models import JobRow, StepRunRow
from service.platform.states import JOB_FINAL, STEP_FINAL, STEP_SUCCESSFUL, JobStatus, StepStatus
from service.rounds import loop_context
from service.settle import close_open_steps, settle_job, step_outputs


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


_TAKE_LEASE = """status = 'running', attempts = s.attempts + 1, lease_token = %(token)s,
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
           AND j.id = s.job_id AND j.status IN ('queued', 'running', 'awaiting_approval')
           AND (s.status IN ('pending', 'retrying')
                OR (s.status = 'running' AND s.lease_until < %(now)s))
           AND NOT EXISTS (
               SELECT 1 FROM step_runs AS u
                WHERE u.job_id = s.job_id AND u.shard = -1
                  AND u.step_id = ANY(s.depends_on)
                  AND u.status NOT IN ('succeeded', 'reused'))
        RETURNING s.attempts, s.inputs_from, j.profile_hash, j.params
    ), started AS (
        UPDATE jobs SET status = 'running', started_at = %(now)s
         WHERE id = %(job_id)s AND status = 'queued' AND EXISTS (SELECT 1 FROM claimed)
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


@dataclass(frozen=True)
class FastClaim:
    lease: Lease
    profile: Profile
    params: dict[str, Any]
    outputs: dict[str, Any]


def fast_claim(
    conn: psycopg.Connection[Any], key: StepKey, *, task_id: str, lease_s: float, now: datetime
) -> FastClaim | None:
    """The common case in one autocommitted statement: a ready step nobody holds.

    ``None`` sends the caller down the locking path (``claim_step``) to find out why not: the
    step is settled, held by a live lease, waiting on its upstream, or its job is over.
    """
    params = _lease_params(key, task_id, lease_s, now)
    token = params["token"]
    row = conn.execute(_FAST_CLAIM, params).fetchone()
    if row is None:
        return None
    attempts, profile_hash, job_params, outputs = row
    profile = cached_profile(profile_hash, lambda: _profile_json(conn, key.job_id))
    return FastClaim(Lease(token, attempts), profile, job_params, outputs)


_TAKEN_BY = """
    SELECT step_id FROM step_runs
     WHERE job_id = %(job_id)s AND shard = -1 AND task_id = %(task_id)s
       AND status IN ('running', 'retrying')
     ORDER BY started_at DESC LIMIT 1
    """


def taken_by(conn: psycopg.Connection[Any], job_id: uuid.UUID, task_id: str) -> str | None:
    """The step of the job that the message ``task_id`` went on to and left unsettled: its
    checkpoint claimed the step (``Follow``), then its worker died or the step is to be tried
    again. A message that is delivered again, or retried, continues there."""
    row = conn.execute(_TAKEN_BY, {"job_id": job_id, "task_id": task_id}).fetchone()
    return None if row is None else str(row[0])


def ready_claim(key: StepKey, claim: FastClaim) -> Claimed | None:
    """A fast claim of a plain step as work to run, with no further statement.

    ``None`` when it needs a transaction: a for_each step to fan out, a gate to pass, or
    inputs that do not resolve and must be recorded as the step's failure (``use_fast_claim``).
    """
    if not step_facts(claim.profile, key.step_id).plain:
        return None
    try:
        return _claim_of(key, claim.lease, claim.profile, claim.params, None, claim.outputs)
    except ExpressionError:
        return None


def use_fast_claim(
    session: Session, key: StepKey, claim: FastClaim, now: datetime
) -> Claimed | FanOutDue | Unresolvable | Skipped | None:
    """Turn a fast claim into work: pass its gate, resolve inputs, or hold a for_each step to
    fan out."""
    spec = claim.profile.step(key.step_id)
    if spec.approval is not None:
        row = _lock_step(session, key)
        if not holds_lease(row, claim.lease) or not approved(
            session, _live_job(session, key.job_id), row, spec.approval
        ):
            return None
    unless = _unless_condition(session, key, claim.profile, claim.params, claim.outputs, now)
    if unless is not None:
        return unless
    if spec.for_each is None:
        return _claimed(
            session, key, claim.lease, claim.profile, claim.params, None, now, claim.outputs
        )
    row = _lock_step(session, key)
    if not holds_lease(row, claim.lease):
        return None
    return FanOutDue(_live_job(session, key.job_id), row, spec)


def claim_step(
    session: Session, key: StepKey, *, task_id: str, lease_s: float, now: datetime
) -> Claimed | FanOutDue | Unresolvable | Skipped | None:
    """Take a step for this worker under row locks. ``None`` means it is already settled."""
    job = _live_job(session, key.job_id)
    return _claim_row(session, job, _lock_step(session, key), task_id, lease_s, now)


def _profile_json(conn: psycopg.Connection[Any], job_id: uuid.UUID) -> dict[str, Any]:
    return _job_json(conn, "SELECT profile FROM jobs WHERE id = %s", job_id)


def _job_json(
    conn: psycopg.Connection[Any], query: LiteralString, job_id: uuid.UUID
) -> dict[str, Any]:
    row = conn.execute(query, (job_id,)).fetchone()
    if row is None:
        raise StopChain(f"job {job_id} is gone")
    value: dict[str, Any] = row[0]
    return value


def _claimed(
    session: Session,
    key: StepKey,
    lease: Lease,
    profile: Profile,
    params: dict[str, Any],
    item: Any,
    now: datetime,
    outputs: dict[str, Any] | None = None,
) -> Claimed | Unresolvable:
    facts = step_facts(profile, key.step_id)
    if outputs is None:
        outputs = step_outputs(session, key.job_id, set(facts.referenced))
    decided = decisions(session, key.job_id, facts.decisions)
    loop = loop_context(session, key.job_id, key.step_id, profile) if facts.reads_loop else {}
    trigger = trigger_context(session, key.job_id) if facts.reads_trigger else {}
    try:
        return _claim_of(key, lease, profile, params, item, outputs, decided, loop, trigger)
    except ExpressionError as exc:
        error = {"code": exc.code, "message": exc.message, "details": exc.details}
        settled = _record_failure(session, _lock_step(session, key), key, error, None, now)
        return Unresolvable(key, settled.job_over, settled.ready)


def _claim_of(
    key: StepKey,
    lease: Lease,
    profile: Profile,
    params: dict[str, Any],
    item: Any,
    outputs: dict[str, Any],
    decided: dict[str, Any] | None = None,
    loop: dict[str, Any] | None = None,
    trigger: dict[str, Any] | None = None,
) -> Claimed:
    """Resolve a held step's inputs; raises ``ExpressionError`` when they do not resolve."""
    spec = profile.step(key.step_id)
    facts = step_facts(profile, key.step_id)
    context = ExprContext(
        params=params,
        outputs=outputs,
        absent=_absent(spec, facts.referenced, outputs),
        decisions=decided or {},
        loop=loop or {},
        trigger=trigger or {},
    )
    if key.shard != SHARD_NONE:
        context.item = item
    return Claimed(
        key=key,
        lease=lease,
        action=spec.action,
        inputs=resolve(spec.with_, context),
        params=dict(params),
        retry=spec.retry,
        sink=facts.sink and key.shard == SHARD_NONE,
        profile=profile,
        trigger=trigger or {},
    )


def trigger_context(session: Session, job_id: uuid.UUID) -> dict[str, Any]:
    """What ``trigger.*`` reads: the upstream job and its result, kept on the job when a
    dependency trigger made it, so it outlives the upstream job's retention."""
    data = session.scalar(select(JobRow.trigger_data).where(JobRow.id == job_id))
    return dict(data) if data else {}


def _absent(spec: StepSpec, referenced: frozenset[str], outputs: dict[str, Any]) -> frozenset[str]:
    """A step that ``needs: any`` reads ``null`` for an upstream step that did not succeed."""
    return referenced - outputs.keys() if spec.needs == "any" else frozenset()


def _unless_condition(
    session: Session,
    key: StepKey,
    profile: Profile,
    params: dict[str, Any],
    outputs: dict[str, Any] | None,
    now: datetime,
) -> Skipped | Unresolvable | None:
    """``None`` when the held step's ``when`` holds (or it has none); otherwise it is skipped,
    or failed for good when the condition's references do not resolve."""
    spec = profile.step(key.step_id)
    if spec.condition is None:
        return None
    referenced = step_facts(profile, key.step_id).referenced
    if outputs is None:
        outputs = step_outputs(session, key.job_id, set(referenced))
    context = ExprContext(
        params=params,
        outputs=outputs,
        absent=_absent(spec, referenced, outputs),
        decisions=decisions(session, key.job_id, step_facts(profile, key.step_id).decisions),
        trigger=trigger_context(session, key.job_id)
        if step_facts(profile, key.step_id).reads_trigger
        else {},
    )
    try:
        holds = evaluate(spec.condition, context)
    except ExpressionError as exc:
        error = {"code": exc.code, "message": exc.message, "details": exc.details}
        failed = _record_failure(session, _lock_step(session, key), key, error, None, now)
        return Unresolvable(key, failed.job_over, failed.ready)
    if holds:
        return None
    row = _lock_step(session, key)
    row.attempts -= 1
    return skip_step(session, row, profile, now)


def _claim_row(
    session: Session, job: JobRow, row: StepRunRow, task_id: str, lease_s: float, now: datetime
) -> Claimed | FanOutDue | Unresolvable | Skipped | None:
    key = StepKey(row.job_id, row.step_id, row.shard)
    if row.status in STEP_FINAL or row.status == StepStatus.AWAITING_APPROVAL:
        return None
    _wait_for_peer(row, now)
    spec = job_profile(job).step(key.step_id)
    if key.shard == SHARD_NONE:
        runs = _upstream_allows(session, row, spec)
        if runs is None:
            return None
        if not runs:
            return skip_step(session, row, job_profile(job), now)
    lease = _take_lease(row, job, task_id, lease_s, now)
    if (
        key.shard == SHARD_NONE
        and spec.approval is not None
        and not approved(session, job, row, spec.approval)
    ):
        return None
    if key.shard == SHARD_NONE:
        unless = _unless_condition(session, key, job_profile(job), job.params, None, now)
        if unless is not None:
            return unless
    if spec.for_each is not None and key.shard == SHARD_NONE:
        return FanOutDue(job, row, spec)
    return _claimed(session, key, lease, job_profile(job), job.params, row.item, now)


def _upstream_allows(session: Session, row: StepRunRow, spec: StepSpec) -> bool | None:
    """Whether the step's ``needs`` rule lets it run on what its upstream did.

    ``None`` while some upstream step is unsettled: this message came early (a re-publish),
    and the last upstream step to settle sends the step again.
    """
    upstream = _upstream_statuses(session, row.job_id, spec.depends_on)
    if any(status not in STEP_FINAL for status in upstream):
        return None
    succeeded = [status in STEP_SUCCESSFUL for status in upstream]
    return all(succeeded) if spec.needs == "all" else any(succeeded) or not upstream


def skip_step(session: Session, row: StepRunRow, profile: Profile, now: datetime) -> Skipped:
    """Settle a step without running it; its children count it as settled."""
    row.status = StepStatus.SKIPPED
    row.finished_at = now
    row.lease_token = None
    row.lease_until = None
    key = StepKey(row.job_id, row.step_id)
    ready = release_children(session, key, profile)
    settle_job(session, row.job_id, now)
    return Skipped(key, ready)


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


_COMPLETED = """
    WITH done AS (
        UPDATE step_runs
           SET status = 'succeeded', finished_at = %(now)s, lease_token = NULL,
               lease_until = NULL
         WHERE job_id = %(job_id)s AND step_id = %(step_id)s AND shard = %(shard)s
           AND status = 'running' AND lease_token = %(token)s
        RETURNING job_id
    ), saved AS (
        INSERT INTO step_checkpoints (job_id, step_id, shard, attempt, output, created_at)
        SELECT job_id, %(step_id)s, %(shard)s, %(attempt)s, %(output)s, %(now)s FROM done
        ON CONFLICT DO NOTHING
        RETURNING job_id
    )"""
_COMPLETE = (
    _COMPLETED
    + """, released AS (
        UPDATE step_runs SET waiting_on = waiting_on - 1
         WHERE job_id = %(job_id)s AND step_id = ANY(%(children)s) AND shard = -1
           AND EXISTS (SELECT 1 FROM done)
        RETURNING step_id, waiting_on
    )
    SELECT EXISTS (SELECT 1 FROM saved),
           ARRAY(SELECT step_id FROM released WHERE waiting_on = 0), NULL::text"""
)
"""The checkpoint, and the step counted off its children in the same statement, so a
redelivered message that finds the step settled cannot count it twice."""
_COMPLETE_AND_TAKE = (
    _COMPLETED
    + f""", claimed AS (
        UPDATE step_runs AS s
           SET waiting_on = 0, {_TAKE_LEASE.replace("%(token)s", "%(taken_token)s")}
          FROM jobs AS j
         WHERE s.job_id = %(job_id)s AND s.step_id = %(take)s AND s.shard = -1
           AND s.waiting_on = 1 AND s.status IN ('pending', 'retrying')
           AND j.id = s.job_id AND j.status IN ('queued', 'running', 'awaiting_approval')
           AND EXISTS (SELECT 1 FROM done)
        RETURNING s.attempts, s.inputs_from
    ), released AS (
        UPDATE step_runs SET waiting_on = waiting_on - 1
         WHERE job_id = %(job_id)s AND step_id = ANY(%(children)s) AND shard = -1
           AND EXISTS (SELECT 1 FROM done)
           AND NOT (step_id = %(take)s AND EXISTS (SELECT 1 FROM claimed))
        RETURNING step_id, waiting_on
    )
    SELECT EXISTS (SELECT 1 FROM saved),
           ARRAY(SELECT step_id FROM released WHERE waiting_on = 0), NULL::text,
           c.attempts,
           {_INPUT_OUTPUTS}
           || CASE WHEN %(step_id)s = ANY(c.inputs_from)
                   THEN jsonb_build_object(%(step_id)s, %(output)s::jsonb)
                   ELSE '{{}}'::jsonb END
      FROM (SELECT 1) AS one LEFT JOIN claimed AS c ON true"""
)
"""The checkpoint and the claim of the child that ``Follow`` names, when this step was its
only upstream, in one statement: what ``_FAST_CLAIM`` would have done a message later, under
the same conditions. Every other child is counted off as in ``_COMPLETE``. The child reads
this step's output from the statement's parameter, since its own checkpoint row is not
visible to the statement that writes it."""
_COMPLETE_AND_SUCCEED_JOB = (
    _COMPLETED
    + """, succeeded AS (
        UPDATE jobs SET status = 'succeeded', finished_at = %(now)s, result = %(result)s
         WHERE id = %(job_id)s AND status IN ('queued', 'running')
           AND EXISTS (SELECT 1 FROM saved)
           AND NOT EXISTS (
               SELECT 1 FROM step_runs
                WHERE job_id = %(job_id)s AND shard = -1 AND step_id <> %(step_id)s
                  AND status NOT IN ('succeeded', 'reused', 'skipped'))
        RETURNING trigger
    )
    SELECT EXISTS (SELECT 1 FROM saved), ARRAY[]::text[], (SELECT trigger FROM succeeded)"""
)


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
) -> Completion:
    """Checkpoint a finished attempt in one statement, unless its lease was lost meanwhile.

    With ``succeeds_job`` (the job's sole sink, whose output is the job's result, see
    ``settle.sink_settles_job``) the same statement succeeds the job; a sink has no children.
    With ``follow`` it also claims that child for the caller.
    """
    params = {
        "now": now,
        "job_id": key.job_id,
        "step_id": key.step_id,
        "shard": key.shard,
        "token": lease.token,
        "attempt": lease.attempt,
        "output": Jsonb(output),
    }
    if succeeds_job:
        params["result"] = Jsonb({key.step_id: output})
    else:
        children = step_facts(profile, key.step_id).children if key.shard == SHARD_NONE else ()
        params["children"] = list(children)
    if follow is not None and not succeeds_job:
        return _complete_and_take(conn, key, params, profile, follow)
    statement = _COMPLETE_AND_SUCCEED_JOB if succeeds_job else _COMPLETE
    row = conn.execute(statement, params).fetchone()
    assert row is not None
    written, ready, succeeded_trigger = row
    return Completion(written, steps_plan(profile, key.job_id, ready), succeeded_trigger)


def _complete_and_take(
    conn: psycopg.Connection[Any],
    key: StepKey,
    params: dict[str, Any],
    profile: Profile,
    follow: Follow,
) -> Completion:
    child = StepKey(key.job_id, follow.step_id)
    token = uuid.uuid4().hex
    params |= {
        "take": follow.step_id,
        "taken_token": token,
        "until": params["now"] + timedelta(seconds=follow.lease_s),
        "task_id": follow.task_id,
    }
    row = conn.execute(_COMPLETE_AND_TAKE, params).fetchone()
    assert row is not None
    written, ready, _, attempts, outputs = row
    taken = None if attempts is None else Taken(child, Lease(token, attempts), outputs)
    return Completion(written, steps_plan(profile, key.job_id, ready), None, taken)


_RELEASE = """
    UPDATE step_runs SET lease_token = NULL, lease_until = %(now)s
     WHERE job_id = %(job_id)s AND step_id = %(step_id)s AND shard = %(shard)s
       AND status = 'running' AND lease_token = %(token)s
    """


def release_lease(conn: psycopg.Connection[Any], key: StepKey, lease: Lease, now: datetime) -> None:
    """End an attempt that could not record its outcome as if its worker had died, but now
    rather than ``lease_s`` later: the step stays ``running`` under a lapsed lease, which the next
    delivery claims at once and, should none come, the sweeper re-sends. Only the holder of the
    lease's token can release it, and a renewal in flight cannot revive it."""
    conn.execute(
        _RELEASE,
        {
            "now": now,
            "job_id": key.job_id,
            "step_id": key.step_id,
            "shard": key.shard,
            "token": lease.token,
        },
    )


@dataclass(frozen=True)
class Failed:
    """A failure: whether it ended the job, the children it made ready, and whether it was
    recorded at all (a worker that lost its lease records nothing)."""

    job_over: bool
    ready: JobPlan
    recorded: bool = True


def fail_step(
    session: Session,
    key: StepKey,
    lease: Lease,
    error: dict[str, Any],
    *,
    retry_delay_s: float | None,
    now: datetime,
) -> Failed:
    """Record a failed attempt: back to ``retrying``, or failed for good under the job's policy.

    A worker that lost its lease records nothing.
    """
    row = _lock_step(session, key)
    if not holds_lease(row, lease):
        return Failed(False, JobPlan(key.job_id), recorded=False)
    return _record_failure(session, row, key, error, retry_delay_s, now)


def _record_failure(
    session: Session,
    row: StepRunRow,
    key: StepKey,
    error: dict[str, Any],
    retry_delay_s: float | None,
    now: datetime,
    status: StepStatus = StepStatus.FAILED,
) -> Failed:
    """Under ``best_effort`` a step failed for good counts as settled to its children, whose
    ``needs`` rule then decides whether they run or are skipped. A rejected step is failed for
    good under its own ``status``."""
    row.error = error
    row.lease_token = None
    row.lease_until = None
    nothing = JobPlan(key.job_id)
    if retry_delay_s is not None:
        row.status = StepStatus.RETRYING
        return Failed(False, nothing)
    row.status = status
    row.finished_at = now
    job = session.scalars(select(JobRow).where(JobRow.id == key.job_id).with_for_update()).one()
    if job.status in JOB_FINAL:
        return Failed(True, nothing)
    profile = job_profile(job)
    if profile.failure_policy == "fail_fast":
        _fail_job(session, job, key, error, now)
        undo = record_compensations(session, job, profile, now)
        return Failed(True, JobPlan(key.job_id, compensate=undo))
    ready = release_children(session, key, profile)
    if key.shard == SHARD_NONE:
        settle_job(session, key.job_id, now)
    return Failed(job.status in JOB_FINAL, ready)


def _fail_job(
    session: Session, job: JobRow, key: StepKey, error: dict[str, Any], now: datetime
) -> None:
    where = f"step {key.step_id!r}" + (f" item {key.shard}" if key.shard != SHARD_NONE else "")
    job.status = JobStatus.FAILED
    job.finished_at = now
    metrics.job_finished(session, job.pipeline, job.trigger, job.status)
    job.error = {
        "code": error.get("code", "step_failed"),
        "message": f"{where} failed: {error.get('message', '')}",
        "details": {"step_id": key.step_id, "shard": None if key.shard < 0 else key.shard},
    }
    close_open_steps(session, job.id, StepStatus.CANCELLED, now)


def renew_lease(
    session: Session, row_key: StepKey, lease: Lease, lease_s: float, now: datetime
) -> bool:
    """Extend a held lease; ``False`` when the step was taken away or its job ended."""
    renewed = session.execute(
        update(StepRunRow)
        .where(
            StepRunRow.job_id == row_key.job_id,
            StepRunRow.step_id == row_key.step_id,
            StepRunRow.shard == row_key.shard,
            StepRunRow.lease_token == lease.token,
            StepRunRow.status == StepStatus.RUNNING,
        )
        .values(lease_until=now + timedelta(seconds=lease_s))
        .returning(StepRunRow.id)
    ).first()
    return renewed is not None
