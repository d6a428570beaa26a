"""A fan-out's lanes: each runs open shards one after another in one message, taking them in
batches (ADR 27).

A lane takes as many shards at once as its pace says fit in ``LANE_BATCH_S`` of work, runs them
one after another, and checkpoints them in one statement that also takes the next batch
(``checkpoints.complete_shards_and_take``): short shards then cost a statement and a commit a
batch, not one each, and the lines they logged one more (``steplogs``). Each shard's checkpoint
is still committed before the lane's message is acknowledged and before the fan-out is gathered,
which are the only uses of its output; what a worker that dies mid-batch loses is at most
``LANE_BATCH_S`` of work, run again under the next lease as for any lost attempt. A shard whose
step declares a cache or a rate limit, or whose inputs need a transaction, is taken alone and
recorded as a step is (``runner``).
"""

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from service.engine.attempt import Failure, run_attempt
from service.engine.checkpoints import complete_shards_and_take
from service.engine.claims import fast_shard_claims, job_params, no_shard_left
from service.engine.inputs import ready_shard, use_shard_claim
from service.engine.leases import give_back_shards
from service.engine.runner import Lane, released_if_cut_short, run_claim, settle_failure
from service.engine.runtime import Runtime
from service.engine.steplogs import Said, keep_lines
from service.engine.steps import Claimed, ShardClaim, ShardDone, StepKey, Unresolvable
from service.language.snapshots import step_facts
from service.platform import logs, metrics, tracing
from service.platform.clock import utcnow
from service.platform.constants import LANE_BATCH_MAX, LANE_BATCH_S, LANE_SLICE_S
from service.platform.db import unit_of_work


@dataclass
class _Pace:
    """How long this lane's shards took, and so how many it takes at once: one until the
    first has run, and always one for a step whose shards each need their own statements."""

    batches: bool
    shard_s: float | None = None

    def took(self, seconds: float) -> None:
        self.shard_s = seconds if self.shard_s is None else (self.shard_s + seconds) / 2

    def size(self) -> int:
        if not self.batches or self.shard_s is None:
            return 1
        return max(1, min(LANE_BATCH_MAX, int(LANE_BATCH_S / max(self.shard_s, 1e-6))))


@dataclass(frozen=True)
class _Held:
    """Shards a lane took in one statement, under one lease, and when it took them."""

    shards: list[ShardClaim]
    since: float

    @classmethod
    def now(cls, shards: list[ShardClaim]) -> "_Held":
        return cls(shards, time.monotonic())


_NONE = _Held([], 0.0)


def run_lane(
    rt: Runtime,
    parent: StepKey,
    *,
    task_id: str,
    timeout_errors: tuple[type[BaseException], ...] = (),
    slice_s: float = LANE_SLICE_S,
) -> bool:
    """Run open shards of a fan-out until ``slice_s`` has passed.

    ``True`` when the slice ran out (the caller sends the lane on in a new message),
    ``False`` once no shard is left to take. Short shards share one message, so a fan-out of
    thousands does not pay a message, an ack and a task replacement for every item.
    """
    with logs.bound(job_id=str(parent.job_id), step_id=parent.step_id):
        lane = Lane(task_id, time.monotonic() + slice_s)
        params: dict[str, Any] | None = None
        pace: _Pace | None = None
        held = _NONE
        while True:
            if not held.shards:
                held = _take(rt, parent, lane, 1 if pace is None else pace.size())
            if not held.shards:
                with unit_of_work(rt.sessions) as session:
                    no_shard_left(session, parent)
                return False
            first = held.shards[0]
            if params is None:
                with (
                    released_if_cut_short(rt, first.key, first.lease),
                    rt.claims.connect() as conn,
                ):
                    params = job_params(conn, parent.job_id)
            pace = pace or _Pace(_batches(first))
            if pace.batches:
                held = _run_batch(rt, parent, held, params, lane, pace, timeout_errors)
            else:
                held = _run_alone(rt, parent, first, params, lane, timeout_errors)
            if not held.shards and not lane.open():
                return True


def _take(rt: Runtime, parent: StepKey, lane: Lane, size: int) -> _Held:
    with rt.claims.connect() as conn:
        shards = fast_shard_claims(
            conn, parent, take=size, task_id=lane.task_id, lease_s=rt.settings.lease_s, now=utcnow()
        )
    return _Held.now(shards)


def _batches(shard: ShardClaim) -> bool:
    """Whether the step's shards may be run and checkpointed together: a cache or a rate limit
    writes per shard in its own statement, and inputs that read a decision, a loop, a signal
    or the schedule are read in a transaction of each shard's own (``inputs.ready_shard``)."""
    spec = shard.profile.step(shard.key.step_id)
    reads = step_facts(shard.profile, shard.key.step_id).shard_reads_in_transaction
    return spec.cache is None and spec.rate_limit is None and not reads


def _run_alone(
    rt: Runtime,
    parent: StepKey,
    shard: ShardClaim,
    params: dict[str, Any],
    lane: Lane,
    timeout_errors: tuple[type[BaseException], ...],
) -> _Held:
    """One shard recorded as a step is, its checkpoint taking the lane's next shard."""
    _, taken = run_claim(rt, parent, _work(rt, shard, params), timeout_errors, lane=lane)
    return _Held.now([taken]) if isinstance(taken, ShardClaim) else _NONE


def _work(rt: Runtime, shard: ShardClaim, params: dict[str, Any]) -> Claimed | Unresolvable:
    """The claim as work when its inputs resolve; otherwise a transaction records why not."""
    with released_if_cut_short(rt, shard.key, shard.lease):
        ready = ready_shard(shard, params)
        if ready is not None:
            return ready
        with unit_of_work(rt.sessions) as session:
            return use_shard_claim(session, shard, params, utcnow())


def _run_batch(
    rt: Runtime,
    parent: StepKey,
    held: _Held,
    params: dict[str, Any],
    lane: Lane,
    pace: _Pace,
    timeout_errors: tuple[type[BaseException], ...],
) -> _Held:
    """Run the shards taken together, then checkpoint them and take the next batch in one
    statement, the lines they logged written in one statement before it. A shard that fails,
    or that needs a transaction, first has the shards before it checkpointed and those after
    it given back, then is recorded alone. Once half the batch's lease has passed, the shards
    not yet run are given back instead of run. Lines not yet written when an attempt raises
    are written on the way out, as a step's are."""
    ran: list[ShardDone] = []
    said: list[Said] = []
    shards = held.shards
    first = shards[0]
    with released_if_cut_short(rt, first.key, first.lease):
        try:
            for index, shard in enumerate(shards):
                claim = ready_shard(shard, params)
                stale = time.monotonic() - held.since > rt.settings.lease_s / 2
                if claim is None or stale:
                    _checkpoint(rt, parent, first, ran, said, lane, take=0)
                    _give_back(rt, shards[index:] if stale else shards[index + 1 :])
                    if not stale:
                        run_claim(rt, parent, _work(rt, shard, params), timeout_errors)
                    return _NONE
                outcome = _attempt(rt, claim, timeout_errors, pace, said)
                if isinstance(outcome, Failure):
                    _checkpoint(rt, parent, first, ran, said, lane, take=0)
                    _give_back(rt, shards[index + 1 :])
                    settle_failure(rt, claim, outcome)
                    return _NONE
                ran.append(outcome)
            take = pace.size() if lane.open() else 0
            return _checkpoint(rt, parent, first, ran, said, lane, take=take)
        finally:
            keep_lines(rt.claims, said)


def _attempt(
    rt: Runtime,
    claim: Claimed,
    timeout_errors: tuple[type[BaseException], ...],
    pace: _Pace,
    said: list[Said],
) -> ShardDone | Failure:
    key, lease = claim.key, claim.lease
    with (
        logs.bound(attempt=lease.attempt),
        tracing.span(
            f"step {key.step_id}",
            job_id=str(key.job_id),
            step_id=key.step_id,
            shard=key.shard,
            attempt=lease.attempt,
        ),
    ):
        started, begun = utcnow(), time.monotonic()
        outcome = run_attempt(rt, claim, timeout_errors, None, said)
        pace.took(time.monotonic() - begun)
    if isinstance(outcome, Failure):
        return outcome
    return ShardDone(key, lease, outcome, started, utcnow())


def _checkpoint(
    rt: Runtime,
    parent: StepKey,
    first: ShardClaim,
    ran: Sequence[ShardDone],
    said: list[Said],
    lane: Lane,
    *,
    take: int,
) -> _Held:
    """The batch's one statement, after the one of the lines its attempts logged (``said``,
    emptied once written); nothing when no shard of it ran."""
    keep_lines(rt.claims, said)
    said.clear()
    if not ran:
        return _NONE
    profile = first.profile
    with rt.checkpoints.connect() as conn:
        flushed = complete_shards_and_take(
            conn,
            parent,
            ran,
            utcnow(),
            take=take,
            profile=profile,
            task_id=lane.task_id,
            lease_s=rt.settings.lease_s,
        )
    metrics.FANOUT_ITEMS.labels(profile.step(parent.step_id).action).inc(flushed.written)
    return _Held.now(flushed.taken)


def _give_back(rt: Runtime, shards: Sequence[ShardClaim]) -> None:
    if shards:
        with rt.claims.connect() as conn:
            give_back_shards(conn, shards, utcnow())
