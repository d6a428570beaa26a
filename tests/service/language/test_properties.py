"""Properties that hold for any input, found by Hypothesis rather than listed by hand.

The profile loader turns any text into a valid profile or a ``ProfileInvalid`` naming the
problem, and never into a crash; a loaded profile always satisfies the shipped JSON Schema.
The condition grammar parses or refuses any text with its own error, and evaluates whatever it
parsed to a boolean or its own error: no exception of Python's leaks through, and nothing runs.
"""

import contextlib
import json
import string
from typing import Any

import jsonschema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.language.checks import validate_profile
from service.language.conditions import evaluate, parse_condition
from service.language.expressions import ExprContext
from service.language.loading import load_profile_text
from service.language.profiles import SCHEMA_PATH
from service.language.specs import WHEN_ROOTS
from service.platform.errors import ExpressionError, ProfileInvalid

SCHEMA = json.loads(SCHEMA_PATH.read_text())
FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

names = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True)
scalars = st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=12) | names
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(names, inner, max_size=3),
    max_leaves=12,
)
steps = st.fixed_dictionaries(
    {"id": names, "action": st.sampled_from(["noop", "sleep", "nope"])},
    optional={
        "depends_on": st.lists(names, max_size=2),
        "with": st.dictionaries(names, values, max_size=3),
        "when": st.text(max_size=20),
        "retry": st.dictionaries(st.sampled_from(["attempts", "backoff_s", "x"]), values),
        "timeout_s": values,
    },
)
profiles = st.fixed_dictionaries(
    {"name": names | st.text(max_size=8), "steps": st.lists(steps, max_size=4)},
    optional={
        "params": st.dictionaries(names, st.fixed_dictionaries({"type": names}), max_size=2),
        "failure_policy": st.sampled_from(["fail_fast", "best_effort", "other"]),
        "on": st.fixed_dictionaries({"succeeded": st.lists(names, max_size=2)}),
        "extra": values,
    },
)


@FAST
@given(st.text(alphabet=string.printable, max_size=400))
def test_any_text_loads_as_a_profile_or_is_refused_with_the_reason(text: str) -> None:
    try:
        profile = load_profile_text(text, source="fuzz.yaml", known_actions={"noop", "sleep"})
    except ProfileInvalid as exc:
        assert exc.details["errors"], "a refusal names at least one problem"
        return
    jsonschema.validate(profile.to_json(), SCHEMA)


@FAST
@given(profiles)
def test_any_structure_validates_to_a_profile_the_schema_accepts_or_is_refused(
    data: dict[str, Any],
) -> None:
    try:
        profile = validate_profile(data, source="fuzz", known_actions={"noop", "sleep"})
    except ProfileInvalid as exc:
        assert all({"code", "message"} <= set(e) for e in exc.details["errors"])
        return
    jsonschema.validate(profile.to_json(), SCHEMA)
    assert validate_profile(profile.to_json(), source="again") == profile


tokens = st.sampled_from(
    [
        "${{ params.a }}",
        "${{ params.b.c }}",
        "${{ steps.s.output.x }}",
        "1",
        "2.5",
        "'x'",
        '"y"',
        "true",
        "false",
        "null",
        "[1, 'a']",
        "==",
        "!=",
        "<",
        ">=",
        "in",
        "not in",
        "and",
        "or",
        "not",
        "(",
        ")",
        "[",
        "]",
        ",",
        "__import__('os')",
        "a.b",
        "f(x)",
        "${{",
        "}}",
        "-",
        "lambda",
        "1e309",
    ]
)


@FAST
@given(st.lists(tokens, max_size=12).map(" ".join) | st.text(max_size=60))
def test_any_condition_parses_and_evaluates_or_fails_with_its_own_error(text: str) -> None:
    try:
        condition = parse_condition(text, roots=WHEN_ROOTS)
    except ExpressionError:
        return
    context = ExprContext(params={"a": 1, "b": {"c": [1, "x"]}}, outputs={"s": {"x": "text"}})
    with contextlib.suppress(ExpressionError):
        assert isinstance(evaluate(condition, context), bool)
