import copy
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from service.language.checks import validate_profile
from service.language.loading import (
    MAX_PROFILE_BYTES,
    find_profile,
    list_profiles,
    load_profile_file,
    load_profile_text,
)
from service.language.params import resolve_params
from service.language.profiles import SCHEMA_PATH, Profile, write_json_schema
from service.language.snapshots import step_facts
from service.language.specs import MAX_VERIFY_RULES, RetryPolicy
from service.platform.constants import SHIPPED_DIR
from service.platform.errors import ParamsInvalid, ProfileInvalid, ProfileNotFound
from service.platform.settings import Settings

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


def _waits(index: int, signal: str) -> Mutation:
    return _set(f"steps/{index}/wait_for", {"signal": signal})


def _all(*mutations: Mutation) -> Mutation:
    def apply(data: dict[str, Any]) -> None:
        for mutate in mutations:
            mutate(data)

    return apply


@pytest.mark.parametrize(
    ("mutate", "code", "step", "field"),
    [
        pytest.param(
            _set("steps/2/with/paid", "${{ signals.payment.payload }}"),
            "bad_reference",
            "merge",
            "steps[2].with.paid",
            id="nothing-waits",
        ),
        pytest.param(
            _all(_waits(2, "payment"), _set("steps/0/with/q", "${{ signals.payment.payload }}")),
            "bad_reference",
            "search",
            "steps[0].with.q",
            id="upstream-of-the-wait",
        ),
        pytest.param(
            _all(_waits(0, "payment"), _set("steps/1/for_each/items", "${{ signals.payment }}")),
            "bad_reference",
            "fetch",
            "steps[1].for_each.items",
            id="outside-with-and-when",
        ),
        pytest.param(
            _set("steps/0/wait_for", {"signal": "Pay Me"}),
            "schema",
            "search",
            "steps[0].wait_for.signal",
            id="signal-name",
        ),
        pytest.param(
            _set("steps/0/wait_for", {"signal": "payment", "on_timeout": "retry"}),
            "schema",
            "search",
            "steps[0].wait_for.on_timeout",
            id="on-timeout",
        ),
    ],
)
def test_signal_validation_errors(
    mutate: Mutation, code: str, step: str | None, field: str
) -> None:
    test_validation_errors(mutate, code, step, field)


def test_a_step_downstream_of_a_wait_reads_its_signal() -> None:
    data = valid()
    data["steps"][0]["wait_for"] = {"signal": "payment", "timeout_s": 60, "on_timeout": "continue"}
    data["steps"][0]["with"]["paid"] = "${{ signals.payment.payload.amount }}"
    data["steps"][2]["when"] = "${{ signals.payment.payload.ok }} == true"
    profile = validate_profile(data, source="s", known_actions=ACTIONS)
    assert step_facts(profile, "search").reads_signals == {"payment"}
    assert step_facts(profile, "merge").reads_signals == {"payment"}
    assert not step_facts(profile, "search").plain
    assert step_facts(profile, "fetch").reads_signals == frozenset()


ALL_RULES = [
    {"not_empty": "papers"},
    {"min_items": {"path": "papers", "count": 1}, "message": "nothing found", "retry": False},
    {"max_items": {"count": 500}},
    {"json_schema": {"type": "object", "required": ["papers"], "$defs": {"p": {}}}},
    {"json_schema": {"properties": {"papers": {"items": {"$ref": "#/$defs/p"}}}}},
    {"expr": "${{ output.total }} <= ${{ params.limit }} and 'papers' in ${{ output }}"},
]


def test_verify_rules_load_and_are_stored_as_written() -> None:
    data = valid()
    data["steps"][2]["verify"] = ALL_RULES
    profile = validate_profile(data, source="x.yaml", known_actions=ACTIONS)

    rules = profile.step("merge").verify
    assert [rule.kind for rule in rules] == [
        "not_empty",
        "min_items",
        "max_items",
        "json_schema",
        "json_schema",
        "expr",
    ]
    stored = profile.to_json()["steps"][2]["verify"]
    assert stored[0] == {"not_empty": "papers", "message": "", "retry": True}
    assert stored[1]["min_items"] == {"path": "papers", "count": 1}
    assert validate_profile(profile.to_json(), source="again") == profile


def test_a_step_without_verify_stores_no_verify_key() -> None:
    """Profiles saved before verify existed keep their content hash."""
    profile = validate_profile(valid(), source="x.yaml")
    assert all("verify" not in step for step in profile.to_json()["steps"])


@pytest.mark.parametrize(
    ("rule", "code", "field"),
    [
        pytest.param({}, "schema", "verify[0]", id="no-rule-key"),
        pytest.param({"message": "m"}, "schema", "verify[0]", id="only-a-message"),
        pytest.param({"not_empty": "a", "expr": "true"}, "schema", "verify[0]", id="two-rule-keys"),
        pytest.param({"non_empty": "a"}, "schema", "verify[0].non_empty", id="unknown-key"),
        pytest.param({"not_empty": "a..b"}, "schema", "verify[0].not_empty", id="bad-path"),
        pytest.param(
            {"min_items": {"path": "a", "count": -1}},
            "schema",
            "verify[0].min_items.count",
            id="negative-count",
        ),
        pytest.param(
            {"max_items": {"path": "a"}}, "schema", "verify[0].max_items.count", id="no-count"
        ),
        pytest.param(
            {"min_items": {"count": 1, "at": "a"}},
            "schema",
            "verify[0].min_items.at",
            id="count-extra-key",
        ),
        pytest.param(
            {"json_schema": {"type": "objekt"}},
            "json_schema_invalid",
            "verify[0].json_schema",
            id="bad-schema",
        ),
        pytest.param(
            {"json_schema": {"minItems": -1}},
            "json_schema_invalid",
            "verify[0].json_schema",
            id="bad-schema-keyword",
        ),
        pytest.param(
            {"json_schema": {"items": {"$ref": "https://example.org/s.json"}}},
            "json_schema_invalid",
            "verify[0].json_schema",
            id="remote-ref",
        ),
        pytest.param(
            {"expr": "${{ output.n }} >"},
            "condition_invalid",
            "verify[0].expr",
            id="bad-expr",
        ),
        pytest.param(
            {"expr": "__import__('os')"},
            "condition_invalid",
            "verify[0].expr",
            id="code-in-expr",
        ),
        pytest.param(
            {"expr": "${{ steps.search.output }}"},
            "condition_invalid",
            "verify[0].expr",
            id="expr-names-a-step",
        ),
        pytest.param(
            {"expr": "${{ item }}"}, "condition_invalid", "verify[0].expr", id="expr-names-item"
        ),
        pytest.param(
            {"expr": "${{ params.nope }} == 1"},
            "bad_reference",
            "verify[0].expr",
            id="expr-undeclared-param",
        ),
        pytest.param(
            {"not_empty": "", "retry": "maybe"}, "schema", "verify[0].retry", id="retry-not-bool"
        ),
    ],
)
def test_verify_rule_errors_name_the_file_step_and_field(
    rule: dict[str, Any], code: str, field: str
) -> None:
    data = valid()
    data["steps"][2]["verify"] = [rule]
    with pytest.raises(ProfileInvalid) as info:
        validate_profile(data, source="profiles/x.yaml", known_actions=ACTIONS)

    errors = info.value.details["errors"]
    assert [(e["step"], e["field"], e["code"]) for e in errors] == [
        ("merge", f"steps[2].{field}", code)
    ]
    assert info.value.message.startswith(f"profiles/x.yaml: step 'merge' field {field!r}: ")


def test_too_many_verify_rules() -> None:
    data = valid()
    data["steps"][2]["verify"] = [{"not_empty": ""}] * (MAX_VERIFY_RULES + 1)
    with pytest.raises(ProfileInvalid, match="verify"):
        validate_profile(data, source="x.yaml")


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


@pytest.mark.parametrize(
    ("field", "typo", "closest"),
    [
        ("action", "serach", ["search"]),
        ("action", "wiat", ["wait"]),
        ("compensate", "merg", ["merge"]),
        ("action", "rm -rf", []),
    ],
)
def test_an_unknown_action_names_the_closest_known_ones(
    field: str, typo: str, closest: list[str]
) -> None:
    data = valid()
    if field == "compensate":
        data["steps"][0]["compensate"] = {"action": typo}
    else:
        data["steps"][0]["action"] = typo
    with pytest.raises(ProfileInvalid) as info:
        validate_profile(data, source="s", known_actions=ACTIONS)
    [error] = info.value.details["errors"]
    assert error["code"] == "unknown_action" and error["closest"] == closest
    suggested = f"; did you mean {', '.join(repr(name) for name in closest)}?"
    assert info.value.message.endswith(f"unknown action {typo!r}{suggested if closest else ''}")


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
        pytest.param("a: " + "[" * 5000 + "]" * 5000, "too_deep", id="deep-lists"),
        pytest.param("steps: " + "{a: " * 3000 + "1" + "}" * 3000, "too_deep", id="deep-maps"),
        pytest.param(
            "a: &a x\nb: [" + ", ".join(["*a"] * 101) + "]\n",
            "too_many_aliases",
            id="many-aliases",
        ),
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
    names = [p.name for p in list_profiles(tmp_path)]
    assert names == sorted(names)
    assert {"alpha", "zeta", "papers-digest", "review-loop"} <= set(names)
    assert load_profile_file(tmp_path / "zeta.yaml").name == "zeta"


def test_an_operators_directory_comes_before_the_shipped_profiles(tmp_path: Path) -> None:
    shipped = find_profile(SHIPPED_DIR, "papers-digest")
    own = _write(tmp_path, "papers-digest.yaml", "papers-digest")

    assert find_profile(tmp_path, "papers-digest") != shipped
    assert find_profile(tmp_path, "papers-digest") == load_profile_file(own)
    assert [p.name for p in list_profiles(tmp_path)].count("papers-digest") == 1


def test_without_a_profiles_dir_only_the_shipped_profiles_are_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, "here.yaml", "here")
    monkeypatch.setenv("FLOWBEAT_PROFILES_DIR", "")

    assert Settings().profiles_dir is None
    names = {p.name for p in list_profiles(None)}
    assert "papers-digest" in names and "here" not in names
    assert find_profile(None, "papers-digest") == find_profile(SHIPPED_DIR, "papers-digest")


@pytest.mark.parametrize("kind", ["missing", "a file"])
def test_a_profiles_dir_that_is_not_a_directory_is_refused_at_start(
    tmp_path: Path, kind: str
) -> None:
    path = tmp_path / "own"
    if kind == "a file":
        path.write_text("")

    with pytest.raises(ValidationError, match="is not a directory"):
        Settings(profiles_dir=path)


def test_a_profiles_dir_gone_after_start_leaves_the_shipped_profiles_listed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    own = tmp_path / "own"
    own.mkdir()
    _write(own, "mine.yaml", "mine")
    assert "mine" in {p.name for p in list_profiles(Settings(profiles_dir=own).profiles_dir)}
    (own / "mine.yaml").unlink()
    own.rmdir()

    names = {p.name for p in list_profiles(own)}

    assert "papers-digest" in names and "mine" not in names
    assert "cannot be listed" in caplog.text
    with pytest.raises(ProfileNotFound):
        find_profile(own, "mine")


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


def test_committed_json_schema_is_current_and_regenerated_where_it_is_shipped(
    tmp_path: Path,
) -> None:
    checkout = Path(__file__).resolve().parents[3]
    assert SCHEMA_PATH.relative_to(checkout) == Path("profiles", "profile.schema.json")
    fresh = tmp_path / "schema.json"
    write_json_schema(fresh)
    assert SCHEMA_PATH.read_text(encoding="utf-8") == fresh.read_text(encoding="utf-8"), (
        "profiles/profile.schema.json is stale: run python -m service.language.profiles"
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


@pytest.mark.parametrize(
    ("rules", "ok"),
    [
        pytest.param(ALL_RULES, True, id="every-rule-kind"),
        pytest.param([{"not_empty": "a", "expr": "true"}], False, id="two-rule-keys"),
        pytest.param([{"message": "m"}], False, id="no-rule-key"),
        pytest.param([{"not_empty": None}], False, id="null-rule-key"),
    ],
)
def test_json_schema_describes_verify_rules(rules: list[dict[str, Any]], ok: bool) -> None:
    import jsonschema

    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    data = valid()
    data["steps"][2]["verify"] = rules
    if ok:
        jsonschema.validate(data, schema)
    else:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(data, schema)


@pytest.mark.parametrize(
    ("when", "code"),
    [
        pytest.param("${{ params.limit }} >", "condition_invalid", id="bad-grammar"),
        pytest.param("__import__('os')", "condition_invalid", id="code"),
        pytest.param("${{ output.n }} > 1", "condition_invalid", id="output-root"),
        pytest.param("${{ params.nope }}", "bad_reference", id="undeclared-param"),
        pytest.param("${{ steps.merge.output }}", "bad_reference", id="own-output"),
    ],
)
def test_when_errors_name_the_file_step_and_field(when: str, code: str) -> None:
    data = valid()
    data["steps"][2]["when"] = when
    with pytest.raises(ProfileInvalid) as info:
        validate_profile(data, source="profiles/x.yaml", known_actions=ACTIONS)

    errors = info.value.details["errors"]
    assert [(e["step"], e["field"], e["code"]) for e in errors] == [
        ("merge", "steps[2].when", code)
    ]


def test_a_when_may_read_params_and_upstream_outputs_and_is_stored_as_written() -> None:
    data = valid()
    when = "${{ params.limit }} > 1 and ${{ steps.search.output.total }} in [1, 2]"
    data["steps"][2]["when"] = when

    profile = validate_profile(data, source="x.yaml", known_actions=ACTIONS)

    assert profile.to_json()["steps"][2]["when"] == when
    assert "when" not in profile.to_json()["steps"][1]
    assert step_facts(profile, "merge").referenced >= {"search"}


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        pytest.param(
            "with", {"v": "${{ approval.fetch.payload }}"}, "no approval gate", id="ungated"
        ),
        pytest.param("when", "${{ approval.merge.payload }}", "own decision", id="own-in-when"),
    ],
)
def test_a_decision_is_read_only_from_a_gated_step_once_known(
    field: str, value: Any, problem: str
) -> None:
    data = valid()
    data["steps"][2]["approval"] = {"required": True}
    data["steps"][2][field] = value
    with pytest.raises(ProfileInvalid) as info:
        validate_profile(data, source="x.yaml", known_actions=ACTIONS)

    [error] = info.value.details["errors"]
    assert error["code"] == "bad_reference" and problem in error["message"]


def test_a_gated_step_and_its_downstream_read_its_decision() -> None:
    data = valid()
    data["steps"][1]["approval"] = {"on_timeout": "escalate", "escalate_to": "https://h.example/x"}
    data["steps"][1]["with"]["note"] = "${{ approval.fetch.comment }}"
    data["steps"][2]["when"] = "${{ approval.fetch.payload.go }} == true"

    profile = validate_profile(data, source="x.yaml", known_actions=ACTIONS)

    assert step_facts(profile, "fetch").decisions == {"fetch"}
    assert step_facts(profile, "merge").decisions == {"fetch"}
    assert "approval" not in profile.to_json()["steps"][0]


def _looped(loop: dict[str, Any], **step_with: Any) -> dict[str, Any]:
    """search -> fetch -> merge, with ``loop`` over some of them."""
    data = valid()
    data["steps"][1].pop("for_each")
    data["steps"][1]["with"] = {"id": "${{ params.query }}", **step_with}
    data["loops"] = [{"until": "${{ steps.merge.output.ok }}", **loop}]
    return data


@pytest.mark.parametrize(
    ("loop", "step_with", "code", "field"),
    [
        pytest.param({"steps": ["nope"]}, {}, "loop_invalid", "loops[0].steps", id="unknown"),
        pytest.param(
            {"steps": ["search", "merge"]}, {}, "loop_invalid", "loops[0].steps", id="gap"
        ),
        pytest.param(
            {"steps": ["fetch", "merge"], "until": "${{ params.nope }}"},
            {},
            "bad_reference",
            "loops[0].until",
            id="until-param",
        ),
        pytest.param(
            {"steps": ["merge"], "until": "${{ loop.round }} >"},
            {},
            "condition_invalid",
            "loops[0].until",
            id="until-grammar",
        ),
        pytest.param(
            {"steps": ["merge"]},
            {"r": "${{ loop.round }}"},
            "bad_reference",
            "steps[1].with.r",
            id="loop-outside",
        ),
        pytest.param(
            {"steps": ["fetch", "merge"]},
            {"p": "${{ loop.previous.search.output }}"},
            "bad_reference",
            "steps[1].with.p",
            id="previous-not-in-loop",
        ),
    ],
)
def test_loop_errors_name_the_field(
    loop: dict[str, Any], step_with: dict[str, Any], code: str, field: str
) -> None:
    with pytest.raises(ProfileInvalid) as info:
        validate_profile(_looped(loop, **step_with), source="x.yaml", known_actions=ACTIONS)

    assert (field, code) in [(e["field"], e["code"]) for e in info.value.details["errors"]]


def test_a_step_of_a_loop_cannot_wait_for_a_signal() -> None:
    data = _looped({"steps": ["fetch", "merge"]})
    data["steps"][1]["wait_for"] = {"signal": "go"}

    with pytest.raises(ProfileInvalid) as info:
        validate_profile(data, source="x.yaml", known_actions=ACTIONS)

    [error] = info.value.details["errors"]
    assert (error["code"], error["field"]) == ("loop_invalid", "loops[0].steps")
    assert "signal waits cannot be inside a loop" in error["message"]


def test_a_loop_of_adjacent_steps_ends_with_its_last_and_reads_the_round() -> None:
    data = _looped(
        {"steps": ["fetch", "merge"], "max_rounds": 5},
        r="${{ loop.round }}",
        p="${{ loop.previous.merge.output.notes }}",
    )

    profile = validate_profile(data, source="x.yaml", known_actions=ACTIONS)

    [loop] = profile.loops
    assert profile.loop_last(loop) == "merge"
    assert step_facts(profile, "merge").ends_round and step_facts(profile, "fetch").reads_loop
    assert not step_facts(profile, "fetch").ends_round
    assert "loops" not in validate_profile(valid(), source="x").to_json()


@pytest.mark.parametrize(
    ("compensate", "code", "field"),
    [
        pytest.param(
            {"action": "nope"}, "unknown_action", "steps[2].compensate.action", id="action"
        ),
        pytest.param(
            {"action": "merge", "with": {"x": "${{ params.nope }}"}},
            "bad_reference",
            "steps[2].compensate.with.x",
            id="param",
        ),
        pytest.param(
            {"action": "merge", "retry": {"attempts": 0}},
            "schema",
            "steps[2].compensate.retry.attempts",
            id="retry",
        ),
    ],
)
def test_compensate_errors_name_the_field(
    compensate: dict[str, Any], code: str, field: str
) -> None:
    data = valid()
    data["steps"][2]["compensate"] = compensate
    with pytest.raises(ProfileInvalid) as info:
        validate_profile(data, source="x.yaml", known_actions=ACTIONS)

    assert (field, code) in [(e["field"], e["code"]) for e in info.value.details["errors"]]


def test_a_compensation_reads_its_own_steps_output_and_params() -> None:
    data = valid()
    data["steps"][2]["compensate"] = {
        "action": "merge",
        "with": {"undo": "${{ steps.merge.output.id }}", "q": "${{ params.query }}"},
    }
    data["on_cancel"] = "leave"

    profile = validate_profile(data, source="x.yaml", known_actions=ACTIONS)

    assert profile.step("merge").compensate is not None
    assert profile.to_json()["on_cancel"] == "leave"
    assert "on_cancel" not in validate_profile(valid(), source="x").to_json()


def test_a_few_anchors_and_aliases_are_fine() -> None:
    text = (
        "name: anchors\n"
        "steps:\n"
        "  - {id: a, action: noop, retry: &retry {attempts: 2}}\n"
        "  - {id: b, action: noop, depends_on: [a], retry: *retry}\n"
    )
    profile = load_profile_text(text, source="in.yaml")
    assert profile.step("b").retry == profile.step("a").retry


def test_a_job_of_more_than_200_steps_is_refused() -> None:
    steps = [{"id": f"s{n}", "action": "noop"} for n in range(201)]
    with pytest.raises(ProfileInvalid) as info:
        validate_profile({"name": "huge", "steps": steps}, source="huge.yaml")
    [error] = info.value.details["errors"]
    assert error["field"] == "steps"
    assert "200" in error["message"]


@pytest.mark.parametrize(
    ("rate", "code", "field"),
    [
        pytest.param({"key": "src", "limit": 0}, "schema", "rate_limit.limit", id="no-limit"),
        pytest.param({"key": "", "limit": 1}, "schema", "rate_limit.key", id="empty-key"),
        pytest.param(
            {"key": "src", "limit": 5, "per_s": 30}, "schema", "rate_limit.per_s", id="per-s"
        ),
        pytest.param(
            {"key": "src", "limit": 2, "units": 3},
            "schema",
            "rate_limit",
            id="units-over-limit",
        ),
        pytest.param(
            {"key": "${{ steps.search.output }}", "limit": 1},
            "bad_reference",
            "rate_limit.key",
            id="key-reads-an-output",
        ),
        pytest.param(
            {"key": "s", "limit": 1, "burst": 2}, "schema", "rate_limit.burst", id="extra"
        ),
    ],
)
def test_rate_limit_errors_name_the_file_step_and_field(
    rate: dict[str, Any], code: str, field: str
) -> None:
    data = valid()
    data["steps"][2]["rate_limit"] = rate
    with pytest.raises(ProfileInvalid) as info:
        validate_profile(data, source="profiles/x.yaml", known_actions=ACTIONS)

    errors = info.value.details["errors"]
    assert [(e["step"], e["field"], e["code"]) for e in errors] == [
        ("merge", f"steps[2].{field}", code)
    ]
    assert info.value.message.startswith(f"profiles/x.yaml: step 'merge' field {field!r}: ")


def test_a_for_each_step_takes_no_rate_limit() -> None:
    data = valid()
    data["steps"][1]["rate_limit"] = {"key": "src", "limit": 1}
    with pytest.raises(ProfileInvalid) as info:
        validate_profile(data, source="x.yaml", known_actions=ACTIONS)
    assert "takes no rate limit" in info.value.message


def test_a_rate_limited_step_stays_plain_and_its_limit_is_stored_as_written() -> None:
    data = valid()
    rate = {"key": "${{ params.query }}-lims", "limit": 10, "per_s": 60, "units": 2}
    data["steps"][2]["rate_limit"] = rate
    profile = validate_profile(data, source="x.yaml", known_actions=ACTIONS)
    assert profile.to_json()["steps"][2]["rate_limit"] == rate
    assert (
        step_facts(profile, "merge").plain
        == step_facts(
            validate_profile(valid(), source="x.yaml", known_actions=ACTIONS), "merge"
        ).plain
    )
    assert "rate_limit" not in validate_profile(valid(), source="x").to_json()["steps"][2]
