"""The step cache's key: the action's name and version with the resolved inputs, a secret by
its name and never its value (what a cached step takes is proven on real workers in
``tests/e2e/test_step_cache.py``)."""

import uuid

from service.actions import ActionRegistry, StepContext
from service.engine.stepcache import cache_key
from service.language.expressions import secret_mark


def echo(ctx: StepContext, text: str) -> str:
    return text


def test_the_same_call_has_the_same_key_whatever_the_order_of_its_inputs() -> None:
    assert cache_key("a", "1", {"x": 1, "y": [2]}, None) == cache_key(
        "a", "1", {"y": [2], "x": 1}, None
    )


def test_another_input_action_or_version_is_another_key() -> None:
    base = cache_key("a", "1", {"x": 1}, None)
    assert base != cache_key("a", "1", {"x": 2}, None)
    assert base != cache_key("b", "1", {"x": 1}, None)
    assert base != cache_key("a", "2", {"x": 1}, None)


def test_a_secret_counts_by_its_name_whatever_the_attempts_nonce() -> None:
    first, second = uuid.uuid4().hex, uuid.uuid4().hex
    inputs_of = {n: {"token": secret_mark(n, "API_TOKEN")} for n in (first, second)}
    key = cache_key("a", "1", inputs_of[first], first)
    assert key == cache_key("a", "1", inputs_of[second], second)
    other = cache_key("a", "1", {"token": secret_mark(first, "OTHER_TOKEN")}, first)
    assert key != other


def test_an_unversioned_action_is_versioned_by_its_source() -> None:
    registry = ActionRegistry()
    registry.register("echo", echo)
    registry.register("echo.pinned", echo, version="2")
    assert registry.registration("echo").cache_version().startswith("src:")
    assert registry.registration("echo.pinned").cache_version() == "2"
