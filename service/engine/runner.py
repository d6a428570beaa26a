"""Runs one step attempt in a worker: claim (``claims``, then ``inputs``), attempt (``attempt``:
the action under a renewed lease), record (``checkpoints``, or ``completion`` for a failure,
``loops`` for a round).

Each returns the steps its attempt made ready, for the task adapter to send; task adapters also
translate ``RetryLater`` and ``StopChain`` for Celery.
"""

import contextlib
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from sqlalchemy.orm import Session

from service.engine import stepcache
from service.engine.attempt import Failure, retry_in_s, run_attempt
from service.engine.checkpoints import complete_shard_and_take, complete_step
from service.engine.claims import (
    claim_step,
    fast_claim,
    taken_by,
    use_fast_claim,
)
from service.engine.completion import fail_step
from service.engine.inputs import ready_claim
from service.engine.leases import release_lease
from service.engine.loops import complete_round
from service.engine.rates import parks_for_rate
from service.engine.runtime import Runtime
from service.engine.settle import settle_job, sink_settles_job
from service.engine.shards import FannedOut, fan_out, finish_fanout
from service.engine.steps import (
    CacheWrite,
    Claimed,
    Completion,
    FanOutDue,
    FastClaim,
    Follow,
    Lease,
    ShardClaim,
    Skipped,
    StepKey,
    Unresolvable,
    Woke,
)
from service.language.plan import JobPlan
from service.language.snapshots import step_facts
from service.platform import logs, metrics, tracing
from service.platform.clock import utcnow
from service.platform.constants import SHARD_NONE
from service.platform.db import unit_of_work
from service.platform.errors import (
    RetryLater,
    StopChain,
)
from service.platform.settings import Settings
from service.platform.states import JobStatus

RELEASE_TRIES = 2
"""The first try may meet a connection that PostgreSQL dropped with the one the attempt died
on; the second goes out on a fresh one."""


@dataclass(frozen=True)
class Inline:
    """What lets a step's message run the rest of a chain in the same process, each next step
    claimed by the checkpoint of the one before (``steps.Follow``) instead of sent.

    ``fits`` says whether a step with that timeout can still start within the message's time
    limits; ``timed`` holds one action to its step's own timeout, since those limits are
    longer than one step's; ``send`` sends what else a step made ready before the next runs.
    A step that follows carries the message's task id, so the message's redelivery after its
    worker died, or its retry, goes on with that step (``run_step``); the sweeper sends it
    again once its lease lapsed, as for any step whose worker died.
    """

    fits: Callable[[int], bool]
    timed: Callable[[int], AbstractContextManager[None]]
    send: Callable[[JobPlan], None]


@dataclass(frozen=True)
class Lane:
    """A lane's message: its task id, and the end of its slice, before which a shard's
    checkpoint takes the lane's next shard in its own statement."""

    task_id: str
    until: float

    def open(self) -> bool:
        return time.monotonic() < self.until


_Follows = tuple[StepKey, FastClaim]
_Next = _Follows | ShardClaim
"""What a checkpoint took for the same worker to run next: a chain's child, or a lane's
next shard."""


@contextlib.contextmanager
def released_if_cut_short(rt: Runtime, key: StepKey, lease: Lease) -> Iterator[None]:
    """Give the lease back when the attempt ends before its outcome is recorded.

    A dropped connection, a time limit or a bug between claim and record would otherwise leave
    a live lease behind, and the delivery that follows would wait ``lease_s`` for it to lapse.
    ``RetryLater`` and ``StopChain`` come once the outcome is recorded, or once the lease is no
    longer this attempt's. With the database out of reach the lease lapses as before.
    """
    try:
        yield
    except (RetryLater, StopChain):
        raise
    except BaseException:
        _release(rt, key, lease)
        raise


def _release(rt: Runtime, key: StepKey, lease: Lease) -> None:
    for _ in range(RELEASE_TRIES):
        try:
            with rt.claims.connect() as conn:
                release_lease(conn, key, lease, utcnow())
        except psycopg.OperationalError:
            continue
        return


def run_step(
    rt: Runtime,
    key: StepKey,
    *,
    task_id: str,
    timeout_errors: tuple[type[BaseException], ...] = (),
    inline: Inline | None = None,
) -> FannedOut | JobPlan:
    """Run a step once, and with ``inline`` the steps that follow it in a chain while they
    fit. Returns what is left to send, or a for_each step's shards for the caller to fan out.

    A message whose step is settled already goes on where an earlier delivery of it left off
    (``claims.taken_by``): a step that followed in it, whose worker died or that is to be
    tried again, is run by the message's next delivery or retry, as its own message's would."""
    with logs.bound(job_id=str(key.job_id), step_id=key.step_id):
        now, lease_s = utcnow(), rt.settings.lease_s
        with rt.claims.connect() as conn:
            fast = fast_claim(conn, key, task_id=task_id, lease_s=lease_s, now=now)
        claim: Claimed | FannedOut | Unresolvable | Skipped | Completion | Woke | None
        if fast is None:
            with unit_of_work(rt.sessions) as session:
                held = claim_step(session, key, task_id=task_id, lease_s=lease_s, now=now)
                claim = _fanned_out(session, held, now, rt.settings)
            if claim is None and key.shard == SHARD_NONE:
                with rt.claims.connect() as conn:
                    went_on = taken_by(conn, key.job_id, task_id)
                if went_on is not None and went_on != key.step_id:
                    resumed = StepKey(key.job_id, went_on)
                    return run_step(
                        rt, resumed, task_id=task_id, timeout_errors=timeout_errors, inline=inline
                    )
        else:
            claim = _fast_work(rt, key, fast, now)
        if isinstance(claim, FannedOut):
            return claim
        plan, follow = run_claim(rt, key, claim, timeout_errors, inline, task_id)
    while follow is not None:
        assert inline is not None and not isinstance(follow, ShardClaim)
        plan, follow = _run_next(rt, plan, follow, timeout_errors, inline, task_id)
    return plan


def _fast_work(
    rt: Runtime, key: StepKey, fast: FastClaim, now: datetime
) -> Claimed | FannedOut | Unresolvable | Skipped | Completion | Woke | None:
    with released_if_cut_short(rt, key, fast.lease):
        claim = ready_claim(key, fast)
        if claim is None:
            with unit_of_work(rt.sessions) as session:
                due = use_fast_claim(session, key, fast, now)
                return _fanned_out(session, due, now, rt.settings)
        return claim


def _run_next(
    rt: Runtime,
    ready: JobPlan,
    follow: _Follows,
    timeout_errors: tuple[type[BaseException], ...],
    inline: Inline,
    task_id: str,
) -> tuple[JobPlan, _Next | None]:
    """Send what the step before made ready beside ``follow``, then run ``follow``."""
    key, fast = follow
    with logs.bound(job_id=str(key.job_id), step_id=key.step_id):
        with released_if_cut_short(rt, key, fast.lease):
            inline.send(ready)
        claim = _fast_work(rt, key, fast, utcnow())
        assert not isinstance(claim, FannedOut)
        return run_claim(rt, key, claim, timeout_errors, inline, task_id)


def _fanned_out(
    session: Session,
    claim: Claimed | FanOutDue | Unresolvable | Skipped | Woke | None,
    now: datetime,
    settings: Settings,
) -> Claimed | FannedOut | Unresolvable | Skipped | Completion | Woke | None:
    if isinstance(claim, FanOutDue):
        max_items, max_job_steps = settings.max_fanout_items, settings.max_job_steps
        return fan_out(session, claim, now, max_items=max_items, max_job_steps=max_job_steps)
    return claim


def run_claim(
    rt: Runtime,
    asked: StepKey,
    claim: Claimed | Unresolvable | Skipped | Completion | Woke | None,
    timeout_errors: tuple[type[BaseException], ...],
    inline: Inline | None = None,
    task_id: str = "",
    lane: Lane | None = None,
) -> tuple[JobPlan, _Next | None]:
    if claim is None:
        return JobPlan(asked.job_id), None
    if not isinstance(claim, Claimed):
        return claim.ready, None
    with released_if_cut_short(rt, claim.key, claim.lease):
        cache = stepcache.probe(rt, claim, utcnow())
        parked = (cache is None or cache.source is None) and parks_for_rate(rt, claim)
    if parked:
        return JobPlan(asked.job_id), None
    with (
        logs.bound(attempt=claim.lease.attempt),
        tracing.span(
            f"step {claim.key.step_id}",
            job_id=str(claim.key.job_id),
            step_id=claim.key.step_id,
            shard=claim.key.shard,
            attempt=claim.lease.attempt,
        ),
    ):
        return _settled(rt, claim, cache, timeout_errors, inline, task_id, lane)


def _settled(
    rt: Runtime,
    claim: Claimed,
    cache: stepcache.Probe | None,
    timeout_errors: tuple[type[BaseException], ...],
    inline: Inline | None,
    task_id: str,
    lane: Lane | None = None,
) -> tuple[JobPlan, _Next | None]:
    """The attempt, and its outcome recorded: a checkpoint, a retry, a failure or a round;
    and the step that follows, or the lane's next shard, when the checkpoint claimed it. A
    step the cache answers (``cache``, probed before its rate limit) runs no action and so
    takes no unit of its rate limit."""
    key = claim.key
    with released_if_cut_short(rt, key, claim.lease):
        outcome = _attempt(rt, claim, cache, timeout_errors, inline)
        if isinstance(outcome, Failure):
            return settle_failure(rt, claim, outcome), None
        now = utcnow()
        if key.shard == SHARD_NONE and step_facts(claim.profile, key.step_id).ends_round:
            with unit_of_work(rt.sessions) as session:
                plan = complete_round(session, key, claim.lease, outcome, claim.profile, now)
                return plan, None
        succeeds_job = claim.sink and sink_settles_job(claim.profile, key.step_id)
        follow = _follow(rt, claim, inline, task_id)
        written = None if cache is None else cache.write()
        done = _checkpoint(rt, claim, outcome, now, succeeds_job, follow, lane, written)
    if done.written and key.shard != SHARD_NONE:
        metrics.FANOUT_ITEMS.labels(claim.action).inc()
    if done.succeeded_trigger is not None:
        metrics.job_finished(None, claim.profile.name, done.succeeded_trigger, JobStatus.SUCCEEDED)
    if done.written and claim.sink and not succeeds_job:
        with unit_of_work(rt.sessions) as session:
            settle_job(session, key.job_id, now)
    if done.next_shard is not None:
        return done.ready, done.next_shard
    if done.taken is None:
        return done.ready, None
    taken = done.taken
    fast = FastClaim(taken.lease, claim.profile, claim.params, taken.outputs)
    return done.ready, (taken.key, fast)


def _attempt(
    rt: Runtime,
    claim: Claimed,
    cache: stepcache.Probe | None,
    timeout_errors: tuple[type[BaseException], ...],
    inline: Inline | None,
) -> Any:
    """The output the step cache gave, the action not run; else the attempt's outcome."""
    if cache is not None and cache.source is not None:
        metrics.STEP_CACHE_HITS.labels(claim.action).inc()
        return cache.source.output
    return run_attempt(rt, claim, timeout_errors, None if inline is None else inline.timed)


def _checkpoint(
    rt: Runtime,
    claim: Claimed,
    output: Any,
    now: datetime,
    succeeds_job: bool,
    follow: Follow | None,
    lane: Lane | None,
    cache: CacheWrite | None,
) -> Completion:
    """The checkpoint's one statement: a shard's takes the lane's next shard while the lane's
    slice lasts, a step's may claim the child that ``follow`` names or succeed its job."""
    key, lease, profile = claim.key, claim.lease, claim.profile
    with rt.checkpoints.connect() as conn:
        if lane is not None and lane.open():
            return complete_shard_and_take(
                conn,
                key,
                lease,
                output,
                now,
                profile=profile,
                task_id=lane.task_id,
                lease_s=rt.settings.lease_s,
                cache=cache,
            )
        return complete_step(
            conn,
            key,
            lease,
            output,
            now,
            profile=profile,
            succeeds_job=succeeds_job,
            follow=follow,
            cache=cache,
        )


def _follow(rt: Runtime, claim: Claimed, inline: Inline | None, task_id: str) -> Follow | None:
    """The child to claim with this step's checkpoint, if one may follow it here."""
    if inline is None or claim.key.shard != SHARD_NONE:
        return None
    child = step_facts(claim.profile, claim.key.step_id).follows
    if child is None or not inline.fits(claim.profile.step(child).timeout_s):
        return None
    return Follow(child, task_id, rt.settings.lease_s)


def settle_failure(rt: Runtime, claim: Claimed, failure: Failure) -> JobPlan:
    attempt, error = claim.lease.attempt, failure.error
    delay = retry_in_s(claim.retry, attempt, failure)
    with unit_of_work(rt.sessions) as session:
        failed = fail_step(
            session, claim.key, claim.lease, error, retry_delay_s=delay, now=utcnow()
        )
    if delay is None and failed.recorded and claim.key.shard != SHARD_NONE:
        metrics.FANOUT_ITEMS.labels(claim.action).inc()
    if delay is not None:
        metrics.STEP_RETRIES.labels(claim.action).inc()
        raise RetryLater(delay, f"attempt {attempt} failed: {error['message']}")
    return failed.ready


def run_finish_fanout(rt: Runtime, key: StepKey) -> JobPlan:
    with (
        logs.bound(job_id=str(key.job_id), step_id=key.step_id),
        unit_of_work(rt.sessions) as session,
    ):
        return finish_fanout(session, key, utcnow())
