from typing import Any

import pytest

from service.language.specs import VerifyRule
from service.language.verify import Unverified, check

OUTPUT = {
    "items": [{"doi": "a"}, {"doi": "b"}],
    "total": 2,
    "zero": 0,
    "no": False,
    "blank": "",
    "none": None,
    "map": {},
    "name": "digest",
}
PARAMS = {"min": 2, "want": "digest"}


def rule(**fields: Any) -> VerifyRule:
    return VerifyRule.model_validate(fields)


@pytest.mark.parametrize(
    ("spec", "output"),
    [
        pytest.param({"not_empty": "items"}, OUTPUT, id="not-empty-list"),
        pytest.param({"not_empty": "items[1].doi"}, OUTPUT, id="not-empty-nested-path"),
        pytest.param({"not_empty": "zero"}, OUTPUT, id="zero-is-a-value"),
        pytest.param({"not_empty": "no"}, OUTPUT, id="false-is-a-value"),
        pytest.param({"not_empty": ""}, OUTPUT, id="whole-output"),
        pytest.param({"min_items": {"path": "items", "count": 2}}, OUTPUT, id="min-items-equal"),
        pytest.param({"max_items": {"path": "items", "count": 2}}, OUTPUT, id="max-items-equal"),
        pytest.param({"min_items": {"count": 1}}, [1], id="min-items-whole-output"),
        pytest.param({"max_items": {"count": 0}}, [], id="max-items-zero"),
        pytest.param({"min_items": {"count": 0}}, (), id="a-tuple-is-a-list"),
        pytest.param(
            {"json_schema": {"type": "object", "required": ["items", "total"]}},
            OUTPUT,
            id="json-schema",
        ),
        pytest.param({"json_schema": {}}, None, id="empty-schema-takes-anything"),
        pytest.param({"expr": "${{ output.total }} >= ${{ params.min }}"}, OUTPUT, id="expr"),
        pytest.param({"expr": "${{ output.name }} == ${{ params.want }}"}, OUTPUT, id="expr-eq"),
        pytest.param({"expr": "${{ output }}"}, [0], id="expr-truthy-output"),
    ],
)
def test_an_output_that_passes(spec: dict[str, Any], output: Any) -> None:
    assert check([rule(**spec)], output, PARAMS) is None


@pytest.mark.parametrize(
    ("spec", "output", "path", "reason"),
    [
        pytest.param(
            {"not_empty": "items"}, {"items": []}, "items", "output.items is empty", id="empty-list"
        ),
        pytest.param(
            {"not_empty": "blank"}, OUTPUT, "blank", "output.blank is empty", id="empty-string"
        ),
        pytest.param({"not_empty": "none"}, OUTPUT, "none", "output.none is empty", id="null"),
        pytest.param({"not_empty": "map"}, OUTPUT, "map", "output.map is empty", id="empty-object"),
        pytest.param({"not_empty": ""}, None, "", "the output is empty", id="empty-output"),
        pytest.param(
            {"not_empty": "gone"},
            OUTPUT,
            "gone",
            "output.gone is missing: no key",
            id="missing-key",
        ),
        pytest.param(
            {"not_empty": "items[5]"},
            OUTPUT,
            "items[5]",
            "missing: index 5 out of range",
            id="index-out-of-range",
        ),
        pytest.param(
            {"min_items": {"path": "items", "count": 3}},
            OUTPUT,
            "items",
            "output.items has 2 items, at least 3",
            id="too-few",
        ),
        pytest.param(
            {"max_items": {"path": "items", "count": 1}},
            OUTPUT,
            "items",
            "output.items has 2 items, at most 1",
            id="too-many",
        ),
        pytest.param(
            {"min_items": {"path": "name", "count": 1}},
            OUTPUT,
            "name",
            "output.name is a str, not a list",
            id="not-a-list",
        ),
        pytest.param(
            {"min_items": {"path": "none", "count": 0}},
            OUTPUT,
            "none",
            "is a null, not a list",
            id="null-is-not-a-list",
        ),
        pytest.param(
            {"max_items": {"path": "nope", "count": 1}},
            OUTPUT,
            "nope",
            "output.nope is missing",
            id="count-of-missing",
        ),
        pytest.param(
            {"json_schema": {"type": "object", "required": ["missing"]}},
            OUTPUT,
            "",
            "'missing' is a required property",
            id="schema-required",
        ),
        pytest.param(
            {"json_schema": {"properties": {"items": {"items": {"required": ["x"]}}}}},
            {"items": [{"x": 1}, {"doi": "b"}]},
            "items[1]",
            "'x' is a required property",
            id="schema-nested-path",
        ),
        pytest.param(
            {"json_schema": {"$ref": "#/$defs/nowhere"}},
            OUTPUT,
            None,
            "does not resolve",
            id="schema-unresolved-ref",
        ),
        pytest.param(
            {"expr": "${{ output.total }} > ${{ params.min }}"},
            OUTPUT,
            None,
            "${{ output.total }} > ${{ params.min }} is false",
            id="expr-false",
        ),
        pytest.param(
            {"expr": "${{ output.gone }}"}, OUTPUT, None, "no key 'gone'", id="expr-unresolved"
        ),
        pytest.param(
            {"expr": "${{ output.name }} > 1"},
            OUTPUT,
            None,
            "cannot order a string",
            id="expr-incompatible-types",
        ),
    ],
)
def test_an_output_that_fails(
    spec: dict[str, Any], output: Any, path: str | None, reason: str
) -> None:
    failed = check([rule(**spec)], output, PARAMS)

    assert failed is not None and failed.retry is True
    kind = next(iter(spec))
    assert failed.details["rule"] == kind and failed.details["index"] == 0
    assert failed.details["path"] == path
    assert reason in failed.details["reason"]
    assert failed.message == f"verify rule 0 ({kind}) failed: {failed.details['reason']}"


def test_the_first_failed_rule_speaks_with_its_own_message_and_retry() -> None:
    rules = [
        rule(not_empty="items"),
        rule(min_items={"path": "items", "count": 5}, message="too few papers", retry=False),
        rule(expr="false"),
    ]

    assert check(rules, OUTPUT, PARAMS) == Unverified(
        "too few papers",
        {
            "rule": "min_items",
            "index": 1,
            "path": "items",
            "reason": "output.items has 2 items, at least 5",
        },
        retry=False,
    )


def test_no_rules_pass_anything() -> None:
    assert check([], None, {}) is None


def test_a_schema_never_fetches_a_remote_ref() -> None:
    """Load time refuses such a schema; this is the second line, should one get through."""
    schema = {"$ref": "http://127.0.0.1:9/schema.json"}
    sneaked = VerifyRule.model_construct(json_schema=schema, message="", retry=True)

    failed = check([sneaked], {}, {})

    assert failed is not None and "does not resolve" in failed.details["reason"]
