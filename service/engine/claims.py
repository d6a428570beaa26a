"""Claiming a step: the fast path of one autocommitted statement whose WHERE clause carries the
rules, the locked path for the rest, the inputs a claimed step runs with, and skipping a step
whose ``when`` is false or whose upstream failed."""

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, LiteralString

import psycopg
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.engine.completion import _record_failure
from service.engine.gates import approved, decisions
from service.engine.rounds import loop_context
from service.engine.settle import settle_job, step_outputs
from service.engine.steps import (
    _FAST_CLAIM,
    Claimed,
    FanOutDue,
    Lease,
    Skipped,
    StepKey,
    Unresolvable,
    _lease_params,
    _live_job,
    _lock_step,
    _take_lease,
    _upstream_statuses,
    _wait_for_peer,
    holds_lease,
    release_children,
)
from service.language.conditions import evaluate
from service.language.expressions import ExprContext, resolve
from service.language.profiles import Profile
from service.language.snapshots import cached_profile, job_profile, step_facts
from service.language.specs import StepSpec
from service.platform.constants import SHARD_NONE
from service.platform.errors import ExpressionError, StopChain
from service.platform.models import JobRow, StepRunRow
from service.platform.states import STEP_FINAL, STEP_SUCCESSFUL, StepStatus, sql_in


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
    session.flush()
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
