"""Runs one step attempt in a worker: claim, call the action under a renewed lease, record.

Task adapters call these functions and translate ``RetryLater`` and ``StopChain`` for Celery.
"""

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from sqlalchemy.orm import Session

from service.actions import StepContext
from service.clock import utcnow
from service.constants import LANE_SLICE_S, SHARD_NONE
from service.db import unit_of_work
from service.errors import ActionError, RetryLater, StepCancelled, StopChain
from service.runtime import Runtime
from service.settle import settle_job, sink_settles_job
from service.shards import (
    FannedOut,
    ShardClaim,
    claim_next_shard,
    fan_out,
    fast_shard_claim,
    finish_fanout,
    job_params,
    ready_shard,
    use_shard_claim,
)
from service.steps import (
    Claimed,
    FanOutDue,
    Lease,
    StepKey,
    Unresolvable,
    claim_step,
    complete_step,
    fail_step,
    fast_claim,
    ready_claim,
    release_lease,
    use_fast_claim,
)

RELEASE_TRIES = 2
"""The first try may meet a connection that PostgreSQL dropped with the one the attempt died
on; the second goes out on a fresh one."""


@dataclass(frozen=True)
class _Failure:
    error: dict[str, Any]
    retryable: bool


@contextlib.contextmanager
def _released_if_cut_short(rt: Runtime, key: StepKey, lease: Lease) -> Iterator[None]:
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
) -> FannedOut | None:
    """Run a step once. A for_each step returns its shards for the caller to fan out."""
    now, lease_s = utcnow(), rt.settings.lease_s
    with rt.claims.connect() as conn:
        fast = fast_claim(conn, key, task_id=task_id, lease_s=lease_s, now=now)
    claim: Claimed | FannedOut | Unresolvable | None
    if fast is None:
        with unit_of_work(rt.sessions) as session:
            held = claim_step(session, key, task_id=task_id, lease_s=lease_s, now=now)
            claim = _fanned_out(session, held, now)
    else:
        with _released_if_cut_short(rt, key, fast.lease):
            claim = ready_claim(key, fast)
            if claim is None:
                with unit_of_work(rt.sessions) as session:
                    claim = _fanned_out(session, use_fast_claim(session, key, fast, now), now)
    if isinstance(claim, FannedOut):
        return claim
    _run_claim(rt, claim, timeout_errors)
    return None


def _fanned_out(
    session: Session, claim: Claimed | FanOutDue | Unresolvable | None, now: datetime
) -> Claimed | FannedOut | Unresolvable | None:
    return fan_out(session, claim, now) if isinstance(claim, FanOutDue) else claim


def run_lane(
    rt: Runtime,
    parent: StepKey,
    *,
    task_id: str,
    timeout_errors: tuple[type[BaseException], ...] = (),
    slice_s: float = LANE_SLICE_S,
) -> bool:
    """Run open shards of a fan-out one after another until ``slice_s`` has passed.

    ``True`` when the slice ran out (the caller sends the lane on in a new message),
    ``False`` once no shard is left to take. Short shards share one message, so a fan-out of
    thousands does not pay a message, an ack and a task replacement for every item.
    """
    started = time.monotonic()
    params: dict[str, Any] | None = None
    while True:
        now = utcnow()
        with rt.claims.connect() as conn:
            fast = fast_shard_claim(
                conn, parent, task_id=task_id, lease_s=rt.settings.lease_s, now=now
            )
        claim: Claimed | Unresolvable | None
        if fast is None:
            with unit_of_work(rt.sessions) as session:
                claim = claim_next_shard(
                    session, parent, task_id=task_id, lease_s=rt.settings.lease_s, now=now
                )
        else:
            with _released_if_cut_short(rt, fast.key, fast.lease):
                if params is None:
                    with rt.claims.connect() as conn:
                        params = job_params(conn, parent.job_id)
                claim = _shard_work(rt, fast, params, now)
        if claim is None:
            return False
        _run_claim(rt, claim, timeout_errors)
        if time.monotonic() - started >= slice_s:
            return True


def _shard_work(
    rt: Runtime, fast: ShardClaim, params: dict[str, Any], now: datetime
) -> Claimed | Unresolvable:
    """The fast claim as work when its inputs resolve; otherwise a transaction records why not."""
    ready = ready_shard(fast, params)
    if ready is not None:
        return ready
    with unit_of_work(rt.sessions) as session:
        return use_shard_claim(session, fast, params, now)


def _run_claim(
    rt: Runtime,
    claim: Claimed | Unresolvable | None,
    timeout_errors: tuple[type[BaseException], ...],
) -> None:
    if claim is None:
        return
    if isinstance(claim, Unresolvable):
        if claim.job_over:
            raise StopChain("a step's references do not resolve")
        return
    key = claim.key
    with _released_if_cut_short(rt, key, claim.lease):
        outcome = _attempt(rt, claim, timeout_errors)
        if isinstance(outcome, _Failure):
            _settle_failure(rt, claim, outcome)
            return
        now = utcnow()
        succeeds_job = claim.sink and sink_settles_job(claim.profile, key.step_id)
        with rt.checkpoints.connect() as conn:
            written = complete_step(conn, key, claim.lease, outcome, now, succeeds_job=succeeds_job)
    if written and claim.sink and not succeeds_job:
        with unit_of_work(rt.sessions) as session:
            settle_job(session, key.job_id, now)


def _attempt(rt: Runtime, claim: Claimed, timeout_errors: tuple[type[BaseException], ...]) -> Any:
    key = claim.key
    ctx = StepContext(
        job_id=str(key.job_id),
        step_id=key.step_id,
        attempt=claim.lease.attempt,
        shard=None if key.shard == SHARD_NONE else key.shard,
        params=claim.params,
        settings=rt.settings,
    )
    try:
        with rt.heartbeats.hold(key, claim.lease, ctx.cancel_event):
            return rt.registry.call(claim.action, ctx, claim.inputs)
    except StepCancelled as exc:
        raise StopChain("cancelled") from exc
    except ActionError as exc:
        failure = _Failure(_error(exc.code, exc.message, exc.details), exc.retryable)
    except timeout_errors as exc:
        failure = _Failure(_error("timeout", f"step timed out: {exc!r}", {}), True)
    except Exception as exc:
        kind = type(exc).__name__
        failure = _Failure(_error("exception", f"{kind}: {exc}", {"type": kind}), True)
    if ctx.cancel_event.is_set():
        raise StopChain("cancelled or taken over")
    return failure


def _error(code: str, message: str, details: dict[str, Any]) -> dict[str, Any]:
    return {"code": code, "message": message, "details": dict(details)}


def _settle_failure(rt: Runtime, claim: Claimed, failure: _Failure) -> None:
    policy, attempt, error = claim.retry, claim.lease.attempt, failure.error
    blocked = {error["code"], error["details"].get("type")} & set(policy.non_retryable)
    retry = failure.retryable and not blocked and attempt < policy.attempts
    delay = policy.delay_s(attempt) if retry else None
    with unit_of_work(rt.sessions) as session:
        over = fail_step(session, claim.key, claim.lease, error, retry_delay_s=delay, now=utcnow())
    if delay is not None:
        raise RetryLater(delay, f"attempt {attempt} failed: {error['message']}")
    if over:
        raise StopChain(error["message"])


def run_finish_fanout(rt: Runtime, key: StepKey) -> None:
    with unit_of_work(rt.sessions) as session:
        finish_fanout(session, key, utcnow())
