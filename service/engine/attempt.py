"""One attempt of a step's action, between its claim and its record: the action called under
the step's renewed lease with its inputs revealed, its output verified, what it logged kept,
and any failure named by a code, all masked of the secrets it revealed before anything is
recorded."""

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from service.actions import StepContext
from service.engine.interrupts import INTERRUPTS
from service.engine.reveal import revealed_inputs
from service.engine.runtime import Runtime
from service.engine.steplogs import Said, keep_lines
from service.engine.steps import Claimed
from service.language import verify
from service.language.specs import RetryPolicy
from service.platform import capture, metrics
from service.platform.constants import SHARD_NONE
from service.platform.errors import ActionError, SecretNotFound, StepCancelled, StopChain
from service.platform.masking import Mask

Timed = Callable[[int], AbstractContextManager[None]]
"""Holds one action to its step's timeout (seconds), when the message's own limits are longer."""


@dataclass(frozen=True)
class Failure:
    error: dict[str, Any]
    retryable: bool


def run_attempt(
    rt: Runtime,
    claim: Claimed,
    timeout_errors: tuple[type[BaseException], ...],
    timed: Timed | None,
    said: list[Said] | None = None,
) -> Any:
    """The attempt's outcome, timed by action, and what it logged kept whatever the outcome
    (or added to ``said``, for a lane that writes its batch's lines together); the secrets it
    revealed masked in all three before any is recorded."""
    started = time.monotonic()
    mask = Mask()
    captured = capture.Capture(rt.settings.step_log_max_bytes, mask)
    try:
        with capture.capturing(captured):
            outcome = _call_action(rt, claim, timeout_errors, timed, mask)
    finally:
        lines = Said(claim.key, claim.lease.attempt, captured.lines())
        if said is None:
            keep_lines(rt.claims, [lines])
        else:
            said.append(lines)
    if mask:
        outcome = _masked(outcome, mask)
    result = "error" if isinstance(outcome, Failure) else "ok"
    metrics.STEP_SECONDS.labels(claim.action, result).observe(time.monotonic() - started)
    return outcome


def _masked(outcome: Any, mask: Mask) -> Any:
    if isinstance(outcome, Failure):
        return Failure(mask.data(outcome.error), outcome.retryable)
    return mask.data(outcome)


def _call_action(
    rt: Runtime,
    claim: Claimed,
    timeout_errors: tuple[type[BaseException], ...],
    timed: Timed | None,
    mask: Mask,
) -> Any:
    key = claim.key
    spec = claim.profile.step(key.step_id)
    limit = nullcontext() if timed is None else timed(spec.timeout_s)
    ctx = StepContext(
        job_id=str(key.job_id),
        step_id=key.step_id,
        attempt=claim.lease.attempt,
        shard=None if key.shard == SHARD_NONE else key.shard,
        params=claim.params,
        settings=rt.settings,
    )
    window = INTERRUPTS.window(key)
    try:
        with rt.heartbeats.hold(key, claim.lease, ctx.cancel_event, window.interrupt), window:
            inputs = revealed_inputs(rt, claim, mask)
            with limit:
                output = rt.registry.call(claim.action, ctx, inputs)
            unverified = verify.check(spec.verify, output, ctx.params, claim.trigger)
        if unverified is None:
            return output
        error = error_of("verification_failed", unverified.message, unverified.details)
        failure = Failure(error, unverified.retry)
    except StepCancelled as exc:
        raise StopChain("cancelled") from exc
    except SecretNotFound as exc:
        failure = Failure(error_of(exc.code, exc.message, exc.details), False)
    except ActionError as exc:
        failure = Failure(error_of(exc.code, exc.message, exc.details), exc.retryable)
    except timeout_errors as exc:
        failure = Failure(error_of("timeout", f"step timed out: {exc!r}", {}), True)
    except Exception as exc:
        kind = type(exc).__name__
        failure = Failure(error_of("exception", f"{kind}: {exc}", {"type": kind}), True)
    if ctx.cancel_event.is_set():
        raise StopChain("cancelled or taken over")
    if not rt.registry.registration(claim.action).retry:
        return Failure(failure.error, False)
    return failure


def error_of(code: str, message: str, details: dict[str, Any]) -> dict[str, Any]:
    return {"code": code, "message": message, "details": dict(details)}


def retry_in_s(policy: RetryPolicy, attempt: int, failure: Failure) -> float | None:
    """Seconds until a failed attempt runs again; ``None`` when it is not to: the failure is
    permanent, its code or exception type is listed as such, or the attempts are spent."""
    error = failure.error
    blocked = {error["code"], error["details"].get("type")} & set(policy.non_retryable)
    if not failure.retryable or blocked or attempt >= policy.attempts:
        return None
    return policy.delay_s(attempt)
