import copy
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.errors import ParamsInvalid, ProfileInvalid, ProfileNotFound
from service.profiles import (
    MAX_PROFILE_BYTES,
    SCHEMA_PATH,
    Profile,
    RetryPolicy,
    find_profile,
    list_profiles,
    load_profile_file,
    load_profile_text,
    resolve_params,
    validate_profile,
    write_json_schema,
)

ACTIONS = {"http.get", "search", "fetch", "merge"}

VALID_YAML = """
name: crispr-weekly
description: weekly literature search
tags: [bio, weekly]
params:
  query: {type: string, required: true}
  limit: {type: integer, default: 50}
steps:
  - id: search
    action: search
    with: {q: "${{ params.query }}", limit: "${{ params.limit }}"}
  - id: fetch
    action: fetch
    depends_on: [search]
    for_each: {items: "${{ steps.search.output.ids }}", max_parallel: 4}
    with: {id: "${{ item }}", label: "doc ${{ item.n }} of ${{ params.query }}"}
    retry: {attempts: 3, backoff_s: 2}
  - id: merge
    action: merge
    depends_on: [fetch]
    with: {docs: "${{ steps.fetch.output }}", total: "${{ steps.search.output.meta.total }}"}
result: {step: merge, items: papers, key: doi}
failure_policy: best_effort
"""


def valid() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(VALID_YAML)
    return data


def test_valid_multi_step_profile_with_for_each() -> None:
    profile = load_profile_text(VALID_YAML, source="x.yaml", known_actions=ACTIONS)
    assert profile.layers() == [["search"], ["fetch"], ["merge"]]
    assert profile.deps() == {"search": [], "fetch": ["search"], "merge": ["fetch"]}
    fetch = profile.step("fetch")
    assert fetch.for_each is not None and fetch.for_each.max_parallel == 4
    assert fetch.retry.attempts == 3
    assert fetch.with_["id"] == "${{ item }}"
    dumped = profile.to_json()
    assert dumped["steps"][0]["with"] == {
        "q": "${{ params.query }}",
        "limit": "${{ params.limit }}",
    }
    assert "with_" not in dumped["steps"][0]
    assert validate_profile(dumped, source="again") == profile
    with pytest.raises(KeyError):
        profile.step("nope")


def test_step_accepts_field_name_with_() -> None:
    data = valid()
    data["steps"][0]["with_"] = data["steps"][0].pop("with")
    assert validate_profile(data, source="s").steps[0].with_["q"] == "${{ params.query }}"


def test_content_hash_ignores_key_order_and_formatting() -> None:
    data = valid()
    reordered = dict(reversed(list(data.items())))
    reordered["steps"] = [dict(reversed(list(s.items()))) for s in data["steps"]]
    as_json = json.dumps(data, indent=4)
    a = validate_profile(data, source="a").content_hash()
    assert validate_profile(reordered, source="b").content_hash() == a
    assert load_profile_text(as_json, source="c.json").content_hash() == a
    assert len(a) == 64
    data["steps"][0]["timeout_s"] = 301
    assert validate_profile(data, source="d").content_hash() != a


Mutation = Callable[[dict[str, Any]], None]


def _set(path: str, value: Any) -> Mutation:
    def apply(data: dict[str, Any]) -> None:
        *parents, last = [int(p) if p.isdigit() else p for p in path.split("/")]
        target: Any = data
        for part in parents:
            target = target[part]
        target[last] = value

    return apply


def _add_step(step: dict[str, Any]) -> Mutation:
    return lambda data: data["steps"].append(step)


@pytest.mark.parametrize(
    ("mutate", "code", "step", "field"),
    [
        pytest.param(_set("name", "Bad Name"), "schema", None, "name", id="bad-name"),
        pytest.param(_set("extra_key", 1), "schema", None, "extra_key", id="extra-top"),
        pytest.param(_set("steps", []), "schema", None, "steps", id="no-steps"),
        pytest.param(
            _set("steps/1/timeout_s", 0), "schema", "fetch", "steps[1].timeout_s", id="timeout"
        ),
        pytest.param(
            _set("steps/1/retry/attempts", 21),
            "schema",
            "fetch",
            "steps[1].retry.attempts",
            id="attempts",
        ),
        pytest.param(_set("steps/2/id", "Merge"), "schema", "Merge", "steps[2].id", id="step-id"),
        pytest.param(_set("steps/2/oops", 1), "schema", "merge", "steps[2].oops", id="extra-step"),
        pytest.param(
            _set("params/limit/default", "ten"), "schema", None, "params.limit", id="default-type"
        ),
        pytest.param(
            _set("steps/1/for_each/items", "ids: ${{ steps.search.output.ids }}"),
            "bad_reference",
            "fetch",
            "steps[1].for_each.items",
            id="for-each-not-whole-ref",
        ),
        pytest.param(
            _set("steps/1/for_each/items", "${{ item }}"),
            "bad_reference",
            "fetch",
            "steps[1].for_each.items",
            id="for-each-item",
        ),
        pytest.param(
            _set("steps/1/for_each/items", "${{ steps.fetch.output }}"),
            "bad_reference",
            "fetch",
            "steps[1].for_each.items",
            id="for-each-self",
        ),
        pytest.param(
            _add_step({"id": "search", "action": "search"}),
            "duplicate_step",
            "search",
            "steps[3].id",
            id="duplicate",
        ),
        pytest.param(
            _set("steps/2/depends_on", ["fetch", "zz"]),
            "unknown_dependency",
            "merge",
            "steps[2].depends_on",
            id="unknown-dep",
        ),
        pytest.param(
            _set("steps/0/depends_on", ["merge"]),
            "cycle",
            "search",
            "steps[0].depends_on",
            id="cycle",
        ),
        pytest.param(
            _set("steps/2/action", "rm -rf"),
            "unknown_action",
            "merge",
            "steps[2].action",
            id="unknown-action",
        ),
        pytest.param(
            _set("steps/0/with/q", "${{ params.q | upper }}"),
            "bad_reference",
            "search",
            "steps[0].with.q",
            id="malformed-expr",
        ),
        pytest.param(
            _set("steps/0/with/q", "${{ params.undeclared }}"),
            "bad_reference",
            "search",
            "steps[0].with.q",
            id="undeclared-param",
        ),
        pytest.param(
            _set("steps/1/depends_on", []),
            "bad_reference",
            "fetch",
            "steps[1].for_each.items",
            id="for-each-not-ancestor",
        ),
        pytest.param(
            _add_step(
                {"id": "side", "action": "merge", "with": {"x": "${{ steps.merge.output }}"}}
            ),
            "bad_reference",
            "side",
            "steps[3].with.x",
            id="step-not-ancestor",
        ),
        pytest.param(
            _set("steps/0/with/q", "${{ steps.search.output }}"),
            "bad_reference",
            "search",
            "steps[0].with.q",
            id="own-output",
        ),
        pytest.param(
            _set("steps/2/with/docs", "${{ item }}"),
            "bad_reference",
            "merge",
            "steps[2].with.docs",
            id="item-outside-for-each",
        ),
        pytest.param(
            _set("result/step", "nope"), "unknown_result_step", None, "result.step", id="result"
        ),
        pytest.param(
            _set("result/items", "a..b"), "schema", None, "result.items", id="result-path"
        ),
        pytest.param(
            _set("schedule", {"cron": "0 25 * * *"}), "cron_invalid", None, "schedule", id="cron"
        ),
        pytest.param(
            _set("schedule", {"every": "1d", "timezone": "Moon/Base"}),
            "timezone_unknown",
            None,
            "schedule",
            id="schedule-zone",
        ),
        pytest.param(
            _set("schedule", {"every": "1d", "params": {"limit": "many"}}),
            "params_invalid",
            None,
            "schedule.params",
            id="schedule-params",
        ),
        pytest.param(
            _set("schedule", {"every": "1d", "when": "mondays"}),
            "schema",
            None,
            "schedule.when",
            id="schedule-extra-field",
        ),
    ],
)
def test_validation_errors(mutate: Mutation, code: str, step: str | None, field: str) -> None:
    data = valid()
    mutate(data)
    with pytest.raises(ProfileInvalid) as info:
        validate_profile(data, source="profiles/x.yaml", known_actions=ACTIONS)
    details = info.value.details
    assert details["source"] == "profiles/x.yaml"
    assert {"step": step, "field": field, "code": code} in [
        {k: e[k] for k in ("step", "field", "code")} for e in details["errors"]
    ]
    assert info.value.message.startswith("profiles/x.yaml: ")


def test_a_schedule_block_is_kept_as_the_default_schedule() -> None:
    data = valid()
    data["schedule"] = {"cron": "0 7 * * 1", "timezone": "Europe/Paris", "params": {"query": "x"}}
    profile = validate_profile(data, source="x", known_actions=ACTIONS)
    assert profile.schedule is not None
    assert (profile.schedule.cron, profile.schedule.overlap) == ("0 7 * * 1", "skip")
    assert profile.to_json()["schedule"]["timezone"] == "Europe/Paris"


def test_transitive_dependency_is_enough_to_reference() -> None:
    data = valid()
    data["steps"][2]["with"]["q"] = "${{ steps.search.output.ids }}"
    validate_profile(data, source="s")


def test_unknown_action_only_checked_when_actions_given() -> None:
    data = valid()
    data["steps"][0]["action"] = "not.registered"
    validate_profile(data, source="s")


def test_all_semantic_errors_are_collected_and_message_names_the_first() -> None:
    data = valid()
    data["steps"][1]["depends_on"] = ["search", "zz"]
    data["steps"][2]["action"] = "nope"
    data["result"]["step"] = "gone"
    with pytest.raises(ProfileInvalid) as info:
        validate_profile(data, source="profiles/x.yaml", known_actions=ACTIONS)
    codes = [e["code"] for e in info.value.details["errors"]]
    assert codes == ["unknown_dependency", "unknown_action", "unknown_result_step"]
    assert info.value.message == (
        "profiles/x.yaml: step 'fetch' field 'depends_on': unknown step 'zz' (and 2 more)"
    )


def test_cycle_message_shows_the_cycle() -> None:
    data = valid()
    data["steps"][0]["depends_on"] = ["merge"]
    with pytest.raises(ProfileInvalid) as info:
        validate_profile(data, source="p")
    cycle = [e for e in info.value.details["errors"] if e["code"] == "cycle"]
    assert cycle[0]["message"] == "dependency cycle: search -> merge -> fetch -> search"


def test_schema_errors_are_all_reported() -> None:
    data = valid()
    data["name"] = "BAD"
    data["steps"][0]["timeout_s"] = -1
    data["failure_policy"] = "whatever"
    with pytest.raises(ProfileInvalid) as info:
        validate_profile(data, source="p")
    fields = {e["field"] for e in info.value.details["errors"]}
    assert fields == {"name", "steps[0].timeout_s", "failure_policy"}


@pytest.mark.parametrize(
    ("text", "code"),
    [
        pytest.param("name: [unclosed", "yaml_syntax", id="yaml-syntax"),
        pytest.param("- just\n- a list\n", "schema", id="not-a-mapping"),
        pytest.param("", "schema", id="empty"),
        pytest.param("x: " + "a" * MAX_PROFILE_BYTES, "too_large", id="too-large"),
        pytest.param(
            "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
            + "".join(
                f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n"
                for i in range(6)
            ),
            "too_large",
            id="alias-bomb",
        ),
        pytest.param("a: &a [*a]\n", "too_large", id="recursive-alias"),
        pytest.param(
            "name: !!python/object/apply:os.system [true]", "yaml_syntax", id="unsafe-tag"
        ),
    ],
)
def test_load_text_errors(text: str, code: str) -> None:
    with pytest.raises(ProfileInvalid) as info:
        load_profile_text(text, source="in.yaml")
    assert info.value.details["errors"][0]["code"] == code


def test_yaml_syntax_error_has_line_and_column() -> None:
    with pytest.raises(ProfileInvalid) as info:
        load_profile_text("name: ok\nsteps: [\n  {id: a\n", source="in.yaml")
    error = info.value.details["errors"][0]
    assert error["line"] >= 2 and error["column"] >= 1
    assert info.value.details["line"] == error["line"]


def _write(directory: Path, filename: str, name: str) -> Path:
    path = directory / filename
    path.write_text(VALID_YAML.replace("crispr-weekly", name), encoding="utf-8")
    return path


def test_find_and_list_profiles(tmp_path: Path) -> None:
    _write(tmp_path, "zeta.yaml", "zeta")
    _write(tmp_path, "alpha.yml", "alpha")
    (tmp_path / "notes.txt").write_text("ignored")
    assert find_profile(tmp_path, "alpha").name == "alpha"
    assert [p.name for p in list_profiles(tmp_path)] == ["alpha", "zeta"]
    assert load_profile_file(tmp_path / "zeta.yaml").name == "zeta"


def test_yaml_preferred_over_yml(tmp_path: Path) -> None:
    _write(tmp_path, "p.yaml", "p")
    (tmp_path / "p.yml").write_text("not: valid")
    assert find_profile(tmp_path, "p").name == "p"


@pytest.mark.parametrize(
    ("name", "code"),
    [("../etc/passwd", "bad_name"), ("Upper", "bad_name"), ("a/b", "bad_name"), ("", "bad_name")],
)
def test_find_profile_bad_names(tmp_path: Path, name: str, code: str) -> None:
    with pytest.raises(ProfileInvalid) as info:
        find_profile(tmp_path, name)
    assert info.value.details["errors"][0]["code"] == code


def test_find_profile_missing(tmp_path: Path) -> None:
    with pytest.raises(ProfileNotFound):
        find_profile(tmp_path, "absent")


def test_find_profile_name_mismatch(tmp_path: Path) -> None:
    _write(tmp_path, "one.yaml", "two")
    with pytest.raises(ProfileInvalid) as info:
        find_profile(tmp_path, "one")
    assert info.value.details["errors"][0]["code"] == "name_mismatch"


def test_find_profile_refuses_symlink_out_of_dir(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    inside = tmp_path / "profiles"
    outside.mkdir()
    inside.mkdir()
    target = _write(outside, "secret.yaml", "secret")
    os.symlink(target, inside / "secret.yaml")
    with pytest.raises(ProfileNotFound):
        find_profile(inside, "secret")


def test_find_profile_follows_a_symlink_that_stays_in_the_dir(tmp_path: Path) -> None:
    target = _write(tmp_path, "weekly-v2.yaml", "weekly")
    os.symlink(target, tmp_path / "weekly.yaml")
    assert find_profile(tmp_path, "weekly").name == "weekly"


def test_find_profile_ignores_a_directory_named_like_a_profile(tmp_path: Path) -> None:
    (tmp_path / "weekly.yaml").mkdir()
    _write(tmp_path, "weekly.yml", "weekly")
    assert find_profile(tmp_path, "weekly").name == "weekly"


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        pytest.param({"query": "x"}, {"query": "x", "limit": 50, "tags": None}, id="defaults"),
        pytest.param(
            {"query": "x", "limit": 3, "tags": ["a"], "ratio": 1},
            {"query": "x", "limit": 3, "tags": ["a"], "ratio": 1},
            id="int-is-a-number",
        ),
        pytest.param(
            {"query": "x", "ratio": 0.5, "flag": False, "opts": {"k": 1}},
            {
                "query": "x",
                "limit": 50,
                "tags": None,
                "ratio": 0.5,
                "flag": False,
                "opts": {"k": 1},
            },
            id="all-types",
        ),
        pytest.param(
            {"query": "x", "limit": None}, {"query": "x", "limit": 50, "tags": None}, id="null"
        ),
    ],
)
def test_resolve_params(given: dict[str, Any], expected: dict[str, Any]) -> None:
    profile = _params_profile()
    resolved = resolve_params(profile, given)
    expected_full = {"ratio": None, "flag": True, "opts": None, **expected}
    assert resolved == expected_full


def _params_profile() -> Profile:
    data = valid()
    data["params"].update(
        tags={"type": "array"},
        ratio={"type": "number"},
        flag={"type": "boolean", "default": True},
        opts={"type": "object"},
    )
    return validate_profile(data, source="p")


@pytest.mark.parametrize(
    ("given", "errors"),
    [
        pytest.param({}, [("query", "missing_param")], id="missing"),
        pytest.param({"query": "x", "zz": 1}, [("zz", "unknown_param")], id="unknown"),
        pytest.param({"query": 1}, [("query", "wrong_type")], id="int-not-string"),
        pytest.param({"query": "x", "limit": True}, [("limit", "wrong_type")], id="bool-not-int"),
        pytest.param({"query": "x", "limit": 1.5}, [("limit", "wrong_type")], id="float-not-int"),
        pytest.param({"query": "x", "ratio": True}, [("ratio", "wrong_type")], id="bool-not-num"),
        pytest.param({"query": "x", "flag": 1}, [("flag", "wrong_type")], id="int-not-bool"),
        pytest.param({"query": "x", "tags": "a"}, [("tags", "wrong_type")], id="str-not-array"),
        pytest.param({"query": "x", "opts": []}, [("opts", "wrong_type")], id="list-not-object"),
        pytest.param(
            {"zz": 1, "limit": "5"},
            [("zz", "unknown_param"), ("query", "missing_param"), ("limit", "wrong_type")],
            id="all-at-once",
        ),
    ],
)
def test_resolve_params_errors(given: dict[str, Any], errors: list[tuple[str, str]]) -> None:
    with pytest.raises(ParamsInvalid) as info:
        resolve_params(_params_profile(), given)
    assert [(e["param"], e["code"]) for e in info.value.details["errors"]] == errors


def test_resolve_params_copies_defaults() -> None:
    data = valid()
    data["params"]["tags"] = {"type": "array", "default": ["a"]}
    profile = validate_profile(data, source="p")
    resolve_params(profile, {"query": "x"})["tags"].append("b")
    assert resolve_params(profile, {"query": "x"})["tags"] == ["a"]


@pytest.mark.parametrize(
    ("policy", "attempt", "rand", "expected"),
    [
        pytest.param(RetryPolicy(backoff_s=1, jitter=0), 1, 0.3, 1.0, id="first"),
        pytest.param(RetryPolicy(backoff_s=1, jitter=0), 4, 0.3, 8.0, id="exponential"),
        pytest.param(RetryPolicy(backoff_s=1, backoff_max_s=5, jitter=0), 10, 0.3, 5.0, id="cap"),
        pytest.param(RetryPolicy(backoff_s=2, jitter=0.5), 1, 1.0, 3.0, id="jitter-up"),
        pytest.param(RetryPolicy(backoff_s=2, jitter=0.5), 1, 0.0, 1.0, id="jitter-down"),
        pytest.param(RetryPolicy(backoff_s=2, jitter=0.5), 1, 0.5, 2.0, id="jitter-mid"),
        pytest.param(RetryPolicy(backoff_s=0), 3, 0.9, 0.0, id="zero"),
        pytest.param(RetryPolicy(jitter=0), 10_000, 0.5, 60.0, id="huge-attempt"),
    ],
)
def test_retry_delay(policy: RetryPolicy, attempt: int, rand: float, expected: float) -> None:
    assert policy.delay_s(attempt, rand=lambda: rand) == pytest.approx(expected)


def test_committed_json_schema_is_current(tmp_path: Path) -> None:
    fresh = tmp_path / "schema.json"
    write_json_schema(fresh)
    assert SCHEMA_PATH.read_text(encoding="utf-8") == fresh.read_text(encoding="utf-8"), (
        "profiles/profile.schema.json is stale: run python -m service.profiles"
    )
    schema = json.loads(fresh.read_text())
    assert "with" in schema["$defs"]["StepSpec"]["properties"]


def test_valid_profile_matches_json_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    jsonschema.validate(valid(), schema)
    bad = copy.deepcopy(valid())
    bad["steps"][0]["nope"] = 1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
