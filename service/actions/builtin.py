"""Built-in actions. Importing this module registers them, with those of the sibling modules."""

import math
from typing import Any

from service.actions import data, datajobs, europepmc, http, llm, pubmed
from service.actions.context import StepContext
from service.actions.registry import action
from service.platform.errors import ActionError

__all__ = [
    "data",
    "datajobs",
    "europepmc",
    "fail",
    "http",
    "llm",
    "noop",
    "pubmed",
    "sleep",
    "text_stats",
]


@action("noop")
def noop(ctx: StepContext, **inputs: Any) -> dict[str, Any]:
    """Echo the inputs back, so tests can see exactly what a step was given."""
    return inputs


@action("sleep", cache=False)
def sleep(ctx: StepContext, seconds: float, result: Any = None) -> Any:
    """Stand in for slow work in tests and drills; wakes at once when the job is cancelled."""
    is_number = isinstance(seconds, int | float) and not isinstance(seconds, bool)
    if not is_number or not math.isfinite(seconds) or seconds < 0:
        raise ActionError(
            f"sleep: seconds must be a finite, non-negative number, got {seconds!r}",
            {"reason": "bad_inputs"},
            retryable=False,
        )
    ctx.sleep(float(seconds))
    return result if result is not None else {"slept": seconds}


@action("fail", cache=False)
def fail(
    ctx: StepContext,
    message: str = "failed",
    retryable: bool = True,
    succeed_on_attempt: int | None = None,
) -> dict[str, Any]:
    """Fail on purpose, for retry and failure-policy drills.

    With ``succeed_on_attempt`` it fails only until that attempt, which lets a test prove that
    retries happen and stop.
    """
    if succeed_on_attempt is not None and ctx.attempt >= succeed_on_attempt:
        return {"attempt": ctx.attempt}
    raise ActionError(message, {"attempt": ctx.attempt}, retryable=retryable)


@action("text.stats")
def text_stats(ctx: StepContext, text: str | None) -> dict[str, int]:
    """Characters and whitespace-separated words of ``text``; null counts as empty."""
    if text is None:
        text = ""
    if not isinstance(text, str):
        raise ActionError(
            f"text.stats: text must be a string, got {type(text).__name__}",
            {"reason": "bad_inputs"},
            retryable=False,
        )
    return {"chars": len(text), "words": len(text.split())}
