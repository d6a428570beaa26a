"""Claiming a step: one statement takes every lease (``fast_claim``), its WHERE clause carrying
the rules; when it takes nothing, ``claim_step`` reads why under row locks and either stops,
skips the step, or takes it through the same statement past an upstream step its ``needs``
rule lets it run without. Then the inputs a claimed step runs with, and skipping a step whose
``when`` is false or whose upstream failed."""

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, LiteralString

import psycopg
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.engine.completion import _record_failure
from service.engine.gates import approved, decisions
from service.engine.rounds import loop_context
from service.engine.settle import settle_job, step_outputs
from service.engine.steps import (
    _INPUT_OUTPUTS,
    _TAKE_LEASE,
    Claimed,
    FanOutDue,
    Lease,
    Skipped,
    StepKey,
    Unresolvable,
    _lock_step,
    holds_lease,
    release_children,
)
from service.language.conditions import evaluate
from service.language.expressions import ExprContext, resolve
from service.language.profiles import Profile
from service.language.snapshots import StepFacts, cached_profile, job_profile, step_facts
from service.language.specs import StepSpec
from service.platform.constants import SHARD_NONE, WAIT_FOR_PEER_MAX_S
from service.platform.db import driver
from service.platform.errors import ExpressionError, RetryLater, StopChain
from service.platform.models import JobRow, StepRunRow
from service.platform.states import (
    JOB_FINAL,
    JOB_OPEN_SQL,
    STEP_DUE_SQL,
    STEP_FINAL,
    STEP_SUCCESSFUL,
    STEP_SUCCESSFUL_SQL,
    JobStatus,
    StepStatus,
    sql_in,
)

_UPSTREAM_SUCCEEDED = f"""
           AND NOT EXISTS (
               SELECT 1 FROM step_runs AS u
                WHERE u.job_id = s.job_id AND u.shard = -1
                  AND u.step_id = ANY(s.depends_on)
                  AND u.status NOT IN {STEP_SUCCESSFUL_SQL})"""


def _claim_statement(upstream: str) -> str:
    """The one statement that takes a step's lease. ``upstream`` is the condition on the
    step's upstream: every one succeeded, or nothing when the caller has read under lock
    that the step's ``needs`` rule runs it past one that did not."""
    return f"""
    WITH claimed AS (
        UPDATE step_runs AS s
           SET {_TAKE_LEASE}
          FROM jobs AS j
         WHERE s.job_id = %(job_id)s AND s.step_id = %(step_id)s AND s.shard = -1
           AND j.id = s.job_id AND j.status IN {JOB_OPEN_SQL}
           AND (s.status IN {STEP_DUE_SQL}
                OR (s.status = '{StepStatus.RUNNING}' AND s.lease_until < %(now)s)){upstream}
        RETURNING s.attempts, s.inputs_from, j.profile_hash, j.params
    ), started AS (
        UPDATE jobs SET status = '{JobStatus.RUNNING}', started_at = %(now)s
         WHERE id = %(job_id)s AND status = '{JobStatus.QUEUED}' AND EXISTS (SELECT 1 FROM claimed)
    )
    SELECT c.attempts, c.profile_hash, c.params,
           {_INPUT_OUTPUTS} AS outputs
      FROM claimed AS c
    """


_FAST_CLAIM = _claim_statement(_UPSTREAM_SUCCEEDED)
_CLAIM_PAST_UPSTREAM = _claim_statement("")


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


@dataclass(frozen=True)
class FastClaim:
    lease: Lease
    profile: Profile
    params: dict[str, Any]
    outputs: dict[str, Any]


def fast_claim(
    conn: psycopg.Connection[Any],
    key: StepKey,
    *,
    task_id: str,
    lease_s: float,
    now: datetime,
    past_upstream: bool = False,
) -> FastClaim | None:
    """Take a ready step nobody holds, in one statement: autocommitted on its own, or inside
    ``claim_step``'s transaction with ``past_upstream``.

    ``None`` sends the caller to ``claim_step`` to find out why not: the step is settled, held
    by a live lease, waiting on its upstream or on a decision, or its job is over.
    """
    params = _lease_params(key, task_id, lease_s, now)
    token = params["token"]
    row = conn.execute(_CLAIM_PAST_UPSTREAM if past_upstream else _FAST_CLAIM, params).fetchone()
    if row is None:
        return None
    attempts, profile_hash, job_params, outputs = row
    profile = cached_profile(profile_hash, lambda: _profile_json(conn, key.job_id))
    return FastClaim(Lease(token, attempts), profile, job_params, outputs)


_TAKEN_BY = f"""
    SELECT step_id FROM step_runs
     WHERE job_id = %(job_id)s AND shard = -1 AND task_id = %(task_id)s
       AND status IN {sql_in((StepStatus.RUNNING, StepStatus.RETRYING))}
     ORDER BY started_at DESC LIMIT 1
    """


def taken_by(conn: psycopg.Connection[Any], job_id: uuid.UUID, task_id: str) -> str | None:
    """The step of the job that the message ``task_id`` went on to and left unsettled: its
    checkpoint claimed the step (``Follow``), then its worker died or the step is to be tried
    again. A message that is delivered again, or retried, continues there."""
    row = conn.execute(_TAKEN_BY, {"job_id": job_id, "task_id": task_id}).fetchone()
    return None if row is None else str(row[0])


@dataclass(frozen=True)
class Held:
    """A step whose lease this worker took, with what its claim read, its spec and facts
    looked up once for everything that turns it into work."""

    key: StepKey
    lease: Lease
    profile: Profile
    params: dict[str, Any]
    outputs: dict[str, Any] | None
    """``None`` when the claim did not read them: read in the transaction that needs them."""
    item: Any = None
    spec: StepSpec = field(init=False)
    facts: StepFacts = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "spec", self.profile.step(self.key.step_id))
        object.__setattr__(self, "facts", step_facts(self.profile, self.key.step_id))

    @classmethod
    def of(cls, key: StepKey, claim: FastClaim) -> "Held":
        return cls(key, claim.lease, claim.profile, claim.params, claim.outputs)


def ready_claim(key: StepKey, claim: FastClaim) -> Claimed | None:
    """A fast claim of a plain step as work to run, with no further statement.

    ``None`` when it needs a transaction: a for_each step to fan out, a gate to pass, or
    inputs that do not resolve and must be recorded as the step's failure (``use_fast_claim``).
    """
    held = Held.of(key, claim)
    if not held.facts.plain:
        return None
    try:
        return _claim_of(held, claim.outputs)
    except ExpressionError:
        return None


def use_fast_claim(
    session: Session, key: StepKey, claim: FastClaim, now: datetime
) -> Claimed | FanOutDue | Unresolvable | Skipped | None:
    """Turn a fast claim into work: pass its gate, resolve inputs, or hold a for_each step to
    fan out."""
    held = Held.of(key, claim)
    spec = held.spec
    if spec.approval is not None:
        row = _lock_step(session, key)
        if not holds_lease(row, claim.lease) or not approved(
            session, _live_job(session, key.job_id), row, spec.approval
        ):
            return None
    unless = _unless_condition(session, held, now)
    if unless is not None:
        return unless
    if spec.for_each is None:
        return _claimed(session, held, now)
    row = _lock_step(session, key)
    if not holds_lease(row, claim.lease):
        return None
    return FanOutDue(_live_job(session, key.job_id), row, spec)


def claim_step(
    session: Session, key: StepKey, *, task_id: str, lease_s: float, now: datetime
) -> Claimed | FanOutDue | Unresolvable | Skipped | None:
    """Claim a step, reading under row locks why the statement alone would not. ``None`` when
    there is nothing to run: the step is settled, waits for a decision, or waits for its
    upstream (this message came early; the last upstream step to settle sends it again).
    Raises ``RetryLater`` while a live lease holds it, ``StopChain`` once its job is over."""
    job = _live_job(session, key.job_id)
    row = _lock_step(session, key)
    if row.status in STEP_FINAL or row.status == StepStatus.AWAITING_APPROVAL:
        return None
    _wait_for_peer(row, now)
    profile = job_profile(job)
    runs = _upstream_allows(session, row, profile.step(key.step_id))
    if runs is None:
        return None
    if not runs:
        return skip_step(session, row, profile, now)
    fast = fast_claim(
        driver(session), key, task_id=task_id, lease_s=lease_s, now=now, past_upstream=True
    )
    session.expire_all()
    return None if fast is None else use_fast_claim(session, key, fast, now)


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


def _claimed(session: Session, held: Held, now: datetime) -> Claimed | Unresolvable:
    key, facts, outputs = held.key, held.facts, held.outputs
    if outputs is None:
        outputs = step_outputs(session, key.job_id, set(facts.referenced))
    decided = decisions(session, key.job_id, facts.decisions)
    loop = loop_context(session, key.job_id, key.step_id, held.profile) if facts.reads_loop else {}
    trigger = trigger_context(session, key.job_id) if facts.reads_trigger else {}
    try:
        return _claim_of(held, outputs, decided, loop, trigger)
    except ExpressionError as exc:
        error = {"code": exc.code, "message": exc.message, "details": exc.details}
        settled = _record_failure(session, _lock_step(session, key), key, error, None, now)
        return Unresolvable(key, settled.job_over, settled.ready)


def _claim_of(
    held: Held,
    outputs: dict[str, Any],
    decided: dict[str, Any] | None = None,
    loop: dict[str, Any] | None = None,
    trigger: dict[str, Any] | None = None,
) -> Claimed:
    """Resolve a held step's inputs; raises ``ExpressionError`` when they do not resolve."""
    key, spec, facts, params = held.key, held.spec, held.facts, held.params
    context = ExprContext(
        params=params,
        outputs=outputs,
        absent=_absent(spec, facts.referenced, outputs),
        decisions=decided or {},
        loop=loop or {},
        trigger=trigger or {},
    )
    if key.shard != SHARD_NONE:
        context.item = held.item
    return Claimed(
        key=key,
        lease=held.lease,
        action=spec.action,
        inputs=resolve(spec.with_, context),
        params=dict(params),
        retry=spec.retry,
        sink=facts.sink and key.shard == SHARD_NONE,
        profile=held.profile,
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


def _unless_condition(session: Session, held: Held, now: datetime) -> Skipped | Unresolvable | None:
    """``None`` when the held step's ``when`` holds (or it has none); otherwise it is skipped,
    or failed for good when the condition's references do not resolve."""
    key, spec, facts, outputs = held.key, held.spec, held.facts, held.outputs
    if spec.condition is None:
        return None
    if outputs is None:
        outputs = step_outputs(session, key.job_id, set(facts.referenced))
    context = ExprContext(
        params=held.params,
        outputs=outputs,
        absent=_absent(spec, facts.referenced, outputs),
        decisions=decisions(session, key.job_id, facts.decisions),
        trigger=trigger_context(session, key.job_id) if facts.reads_trigger else {},
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
    return skip_step(session, row, held.profile, now)


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
