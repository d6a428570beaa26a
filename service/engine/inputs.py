"""What a held step runs with: the outputs of the steps it reads (which its claim's statement
read), the decisions on gated steps, its loop's round, its trigger's data and the signals it
reads; its ``when`` held and its inputs resolved. Or why not, recorded in the same transaction:
a false ``when`` skips it, references that do not resolve fail it for good. Whether it first
parks (a gate, a signal, a slot, a timer) is ``parking``'s to decide.

A plain step, or a shard, whose claim statement read all it needs becomes work with no further
statement (``ready_claim``, ``ready_shard``); anything else reads the rest in a transaction
(``resolve_held``, ``use_shard_claim``).
"""

import secrets
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.engine.completion import not_run
from service.engine.steps import (
    Claimed,
    FastClaim,
    Lease,
    ShardClaim,
    Skipped,
    StepKey,
    Unresolvable,
)
from service.language.conditions import evaluate
from service.language.cron import Timing, previous_fire
from service.language.expressions import ExprContext, resolve, secret_mark
from service.language.profiles import Profile
from service.language.snapshots import StepFacts, step_facts
from service.language.specs import StepSpec
from service.platform.constants import SHARD_NONE
from service.platform.errors import ExpressionError
from service.platform.models import (
    ApprovalRow,
    JobRow,
    JobSignalRow,
    ScheduleRow,
    SignalWaitRow,
    StepRoundRow,
    StepRunRow,
)


@dataclass(frozen=True)
class Held:
    """A step whose lease this worker took, with what its claim read, its spec and facts
    looked up once for everything that turns it into work."""

    key: StepKey
    lease: Lease
    profile: Profile
    params: dict[str, Any]
    outputs: dict[str, Any]
    item: Any = None
    spec: StepSpec = field(init=False)
    facts: StepFacts = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "spec", self.profile.step(self.key.step_id))
        object.__setattr__(self, "facts", step_facts(self.profile, self.key.step_id))

    @classmethod
    def of(cls, key: StepKey, claim: FastClaim) -> "Held":
        return cls(key, claim.lease, claim.profile, claim.params, claim.outputs)

    @classmethod
    def of_shard(cls, claim: ShardClaim, params: dict[str, Any]) -> "Held":
        return cls(claim.key, claim.lease, claim.profile, params, claim.outputs, claim.item)


def ready_claim(key: StepKey, claim: FastClaim) -> Claimed | None:
    """A fast claim of a plain step as work to run, with no further statement.

    ``None`` when it needs a transaction: a for_each step to fan out, a reason it may park for,
    or inputs that do not resolve and must be recorded as the step's failure
    (``claims.use_fast_claim``).
    """
    held = Held.of(key, claim)
    if not held.facts.plain:
        return None
    try:
        return _resolved(held, claim.outputs)
    except ExpressionError:
        return None


def ready_shard(claim: ShardClaim, params: dict[str, Any]) -> Claimed | None:
    """A fast shard claim as work to run, with no further statement; ``None`` when its inputs
    do not resolve and the failure must be recorded in a transaction (``use_shard_claim``),
    or when they read a decision or a signal, which only a transaction reads."""
    if step_facts(claim.profile, claim.key.step_id).shard_reads_in_transaction:
        return None
    try:
        return _resolved(Held.of_shard(claim, params), claim.outputs)
    except ExpressionError:
        return None


def use_shard_claim(
    session: Session, claim: ShardClaim, params: dict[str, Any], now: datetime
) -> Claimed | Unresolvable:
    return resolve_held(session, Held.of_shard(claim, params), now)


def resolve_held(session: Session, held: Held, now: datetime) -> Claimed | Unresolvable:
    """The held step as work, reading what its inputs read beyond its claim; failed for good
    in this transaction when they do not resolve."""
    key, facts = held.key, held.facts
    decided = decisions(session, key.job_id, facts.decisions)
    loop = loop_context(session, key.job_id, key.step_id, held.profile) if facts.reads_loop else {}
    trigger = trigger_context(session, key.job_id) if facts.reads_trigger else {}
    signals = signals_context(session, key.job_id, facts.reads_signals)
    schedule = schedule_context(session, key.job_id) if facts.reads_schedule else {}
    try:
        return _resolved(held, held.outputs, decided, loop, trigger, signals, schedule)
    except ExpressionError as exc:
        return not_run(session, held.key, held.profile, now, exc)


def _resolved(
    held: Held,
    outputs: dict[str, Any],
    decided: dict[str, Any] | None = None,
    loop: dict[str, Any] | None = None,
    trigger: dict[str, Any] | None = None,
    signals: dict[str, Any] | None = None,
    schedule: dict[str, Any] | None = None,
) -> Claimed:
    """Resolve a held step's inputs; raises ``ExpressionError`` when they do not resolve.
    A secret resolves to a mark with a nonce of this attempt's, which only the call reveals."""
    key, spec, facts, params = held.key, held.spec, held.facts, held.params
    nonce = secrets.token_hex(16) if facts.secrets else None
    context = ExprContext(
        params=params,
        outputs=outputs,
        absent=_absent(spec, facts.referenced, outputs),
        decisions=decided or {},
        loop=loop or {},
        trigger=trigger or {},
        signals=signals or {},
        schedule=schedule or {},
    )
    if key.shard != SHARD_NONE:
        context.item = held.item
    if nonce is not None:
        context.secret = partial(secret_mark, nonce)
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
        secret_nonce=nonce,
    )


def _absent(spec: StepSpec, referenced: frozenset[str], outputs: dict[str, Any]) -> frozenset[str]:
    """A step that ``needs: any`` reads ``null`` for an upstream step that did not succeed."""
    return referenced - outputs.keys() if spec.needs == "any" else frozenset()


def unless_condition(session: Session, held: Held, now: datetime) -> Skipped | Unresolvable | None:
    """``None`` when the held step's ``when`` holds (or it has none); otherwise it is skipped,
    or failed for good when the condition's references do not resolve."""
    key, spec, facts = held.key, held.spec, held.facts
    if spec.condition is None:
        return None
    context = ExprContext(
        params=held.params,
        outputs=held.outputs,
        absent=_absent(spec, facts.referenced, held.outputs),
        decisions=decisions(session, key.job_id, facts.decisions),
        trigger=trigger_context(session, key.job_id) if facts.reads_trigger else {},
        signals=signals_context(session, key.job_id, facts.reads_signals),
        schedule=schedule_context(session, key.job_id) if facts.reads_schedule else {},
    )
    try:
        holds = evaluate(spec.condition, context)
    except ExpressionError as exc:
        return not_run(session, held.key, held.profile, now, exc)
    return None if holds else not_run(session, held.key, held.profile, now)


def decisions(session: Session, job_id: uuid.UUID, steps: Collection[str]) -> dict[str, Any]:
    """What was decided on ``steps`` of a job, for ``${{ approval.<step>.payload }}``."""
    if not steps:
        return {}
    rows = session.execute(
        select(
            ApprovalRow.step_id,
            ApprovalRow.status,
            ApprovalRow.payload,
            ApprovalRow.comment,
            ApprovalRow.decided_by,
        ).where(ApprovalRow.job_id == job_id, ApprovalRow.step_id.in_(list(steps)))
    )
    return {
        step: {"status": status, "payload": payload, "comment": comment, "decided_by": by}
        for step, status, payload, comment, by in rows
    }


def loop_context(
    session: Session, job_id: uuid.UUID, step_id: str, profile: Profile
) -> dict[str, Any]:
    """``loop.round`` and ``loop.previous`` for a step of a loop; empty outside loops."""
    loop = profile.loop_of(step_id)
    if loop is None:
        return {}
    current = session.scalar(
        select(StepRunRow.round).where(
            StepRunRow.job_id == job_id,
            StepRunRow.step_id == step_id,
            StepRunRow.shard == SHARD_NONE,
        )
    )
    assert current is not None
    previous = session.execute(
        select(StepRoundRow.step_id, StepRoundRow.output).where(
            StepRoundRow.job_id == job_id,
            StepRoundRow.step_id.in_(loop.steps),
            StepRoundRow.round == current - 1,
        )
    )
    return {"round": current, "previous": {step: output for step, output in previous}}


def trigger_context(session: Session, job_id: uuid.UUID) -> dict[str, Any]:
    """What ``trigger.*`` reads: the upstream job and its result, kept on the job when a
    dependency trigger made it, so it outlives the upstream job's retention."""
    data = session.scalar(select(JobRow.trigger_data).where(JobRow.id == job_id))
    return dict(data) if data else {}


def schedule_context(session: Session, job_id: uuid.UUID) -> dict[str, Any]:
    """What ``schedule.*`` reads: the fire time the job was started for, by its schedule or a
    backfill, and the schedule's fire before it (by its timing now; left out once the schedule
    is deleted); empty for a job nothing scheduled."""
    fire, cron, every_s, timezone = session.execute(
        select(JobRow.scheduled_for, ScheduleRow.cron, ScheduleRow.every_s, ScheduleRow.timezone)
        .outerjoin(ScheduleRow, ScheduleRow.id == JobRow.schedule_id)
        .where(JobRow.id == job_id)
    ).one()
    if fire is None:
        return {}
    context = {"fire_time": fire.astimezone(UTC).isoformat()}
    if timezone is not None:
        previous = previous_fire(Timing(cron, every_s, timezone), fire)
        context["previous_fire_time"] = previous.isoformat()
    return context


def signals_context(session: Session, job_id: uuid.UUID, names: frozenset[str]) -> dict[str, Any]:
    """What ``signals.<name>`` reads: ``{payload, received_at, sent_by}`` of a stored signal,
    ``None`` for one whose wait timed out; a name with neither is left out, so reading it
    fails naming the signal."""
    if not names:
        return {}
    stored = session.scalars(
        select(JobSignalRow).where(JobSignalRow.job_id == job_id, JobSignalRow.name.in_(names))
    ).all()
    context: dict[str, Any] = {
        name: None
        for name in session.scalars(
            select(SignalWaitRow.signal).where(
                SignalWaitRow.job_id == job_id,
                SignalWaitRow.signal.in_(names),
                SignalWaitRow.timed_out_at.is_not(None),
            )
        )
    }
    for signal in stored:
        context[signal.name] = {
            "payload": signal.payload,
            "received_at": signal.received_at.isoformat(),
            "sent_by": signal.sent_by,
        }
    return context
