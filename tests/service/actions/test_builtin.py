import threading
import time
from typing import Any

import pytest

from service.actions import REGISTRY, StepContext, load_plugins
from service.platform.errors import ActionError, StepCancelled
from tests.service.actions import make_ctx


@pytest.fixture(scope="module", autouse=True)
def _builtins() -> None:
    load_plugins(REGISTRY, [], entry_points=[])


def call(name: str, inputs: dict[str, Any], ctx: StepContext | None = None) -> Any:
    return REGISTRY.call(name, ctx or make_ctx(), inputs)


def test_noop_echoes_inputs() -> None:
    assert call("noop", {}) == {}
    assert call("noop", {"a": 1, "b": [True, None]}) == {"a": 1, "b": [True, None]}


@pytest.mark.parametrize(
    ("inputs", "expected"),
    [
        ({"seconds": 0}, {"slept": 0}),
        ({"seconds": 0.01}, {"slept": 0.01}),
        ({"seconds": 0, "result": [1, 2]}, [1, 2]),
        ({"seconds": 0, "result": {"k": "v"}}, {"k": "v"}),
    ],
)
def test_sleep_result(inputs: dict[str, Any], expected: Any) -> None:
    assert call("sleep", inputs) == expected


@pytest.mark.parametrize("seconds", [-1, "1", True, float("inf"), None])
def test_sleep_rejects_bad_seconds(seconds: Any) -> None:
    with pytest.raises(ActionError) as info:
        call("sleep", {"seconds": seconds})
    assert info.value.retryable is False


def test_sleep_stops_when_cancelled() -> None:
    ctx = make_ctx()
    timer = threading.Timer(0.05, ctx.cancel_event.set)
    timer.start()
    started = time.monotonic()
    try:
        with pytest.raises(StepCancelled):
            call("sleep", {"seconds": 30}, ctx)
    finally:
        timer.cancel()
    assert time.monotonic() - started < 5


def test_context_cancellation() -> None:
    ctx = make_ctx()
    assert ctx.cancelled is False
    ctx.check_cancelled()
    ctx.sleep(0)
    ctx.cancel_event.set()
    assert ctx.cancelled is True
    with pytest.raises(StepCancelled) as info:
        ctx.check_cancelled()
    assert info.value.code == "cancelled"
    with pytest.raises(StepCancelled):
        ctx.sleep(0)


@pytest.mark.parametrize(
    ("inputs", "message", "retryable"),
    [
        ({}, "failed", True),
        ({"message": "boom"}, "boom", True),
        ({"message": "permanent", "retryable": False}, "permanent", False),
    ],
)
def test_fail(inputs: dict[str, Any], message: str, retryable: bool) -> None:
    with pytest.raises(ActionError) as info:
        call("fail", inputs)
    assert info.value.message == message
    assert info.value.retryable is retryable
    assert info.value.details == {"attempt": 1}


def test_fail_until_attempt() -> None:
    with pytest.raises(ActionError):
        call("fail", {"succeed_on_attempt": 3}, make_ctx(attempt=2))
    assert call("fail", {"succeed_on_attempt": 3}, make_ctx(attempt=3)) == {"attempt": 3}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", {"chars": 0, "words": 0}),
        (None, {"chars": 0, "words": 0}),
        ("CRISPR gene  therapy\n works", {"chars": 27, "words": 4}),
        ("séquençage", {"chars": 10, "words": 1}),
    ],
)
def test_text_stats(text: str | None, expected: dict[str, int]) -> None:
    assert call("text.stats", {"text": text}) == expected


def test_text_stats_rejects_non_text() -> None:
    with pytest.raises(ActionError) as info:
        call("text.stats", {"text": 12})
    assert info.value.retryable is False
