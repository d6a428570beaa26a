"""A step's ``cache``: a TTL within bounds, refused at save where reusing an output would be
wrong (an action registered with ``cache=False``, the engine's own actions, a loop's steps),
each refusal naming the file, the step and the field."""

from typing import Any

import pytest

from service.language.actionnames import ActionNames
from service.language.checks import validate_profile
from service.platform.constants import CACHE_TTL_MAX_S
from service.platform.errors import ProfileInvalid

ACTIONS = ActionNames({"noop", "fetch", "wait"}, uncacheable={"fetch"})


def _profile(cache: Any, action: str = "noop", loops: Any = ()) -> dict[str, Any]:
    step = {"id": "s", "action": action, "cache": cache}
    if action == "wait":
        step["with"] = {"seconds": 1}
    return {"name": "cached", "steps": [step], **({"loops": loops} if loops else {})}


def _refusal(data: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    with pytest.raises(ProfileInvalid) as info:
        validate_profile(data, source="profiles/cached.yaml", known_actions=ACTIONS)
    [error] = info.value.details["errors"]
    return info.value.message, {k: error[k] for k in ("step", "field", "code")}


def test_a_cached_step_keeps_its_ttl_and_a_plain_step_is_stored_as_before() -> None:
    profile = validate_profile(_profile({"ttl_s": 86400}), source="x", known_actions=ACTIONS)
    assert profile.steps[0].cache is not None and profile.steps[0].cache.ttl_s == 86400
    plain = validate_profile({"name": "p", "steps": [{"id": "s", "action": "noop"}]}, source="x")
    assert "cache" not in plain.to_json()["steps"][0]


@pytest.mark.parametrize("cache", [{"ttl_s": 0}, {"ttl_s": CACHE_TTL_MAX_S + 1}, {}, True])
def test_a_ttl_out_of_bounds_or_missing_is_a_schema_error_on_the_field(cache: Any) -> None:
    message, error = _refusal(_profile(cache))
    assert error["step"] == "s" and error["field"].startswith("steps[0].cache")
    assert message.startswith("profiles/cached.yaml: step 's' field 'cache")


def test_an_action_that_refuses_the_cache_is_refused_at_save() -> None:
    message, error = _refusal(_profile({"ttl_s": 60}, action="fetch"))
    assert error == {"step": "s", "field": "steps[0].cache", "code": "cache_refused"}
    assert "'fetch' refuses the step cache" in message


def test_the_engines_own_wait_cannot_be_cached() -> None:
    _, error = _refusal(_profile({"ttl_s": 60}, action="wait"))
    assert error["code"] == "cache_refused"


def test_a_step_of_a_loop_cannot_be_cached() -> None:
    loops = [{"steps": ["s"], "until": "${{ steps.s.output }}"}]
    _, error = _refusal(_profile({"ttl_s": 60}, loops=loops))
    assert error == {"step": "s", "field": "steps[0].cache", "code": "cache_refused"}
