import math
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from service.actions import REGISTRY, ActionRegistry, StepContext, action, load_plugins
from service.platform.errors import ActionError, ActionModuleUnimportable, ActionNotFound
from tests.service.actions import make_ctx

PLUGIN_CALLS: list[ActionRegistry] = []


def register_plugin(registry: ActionRegistry) -> None:
    PLUGIN_CALLS.append(registry)
    registry.register("plugin.hello", plugin_hello)


def plugin_hello(ctx: StepContext, who: str = "world") -> str:
    return f"hello {who}"


def sample(ctx: StepContext, a: int, b: int = 1, *, c: str, d: bool = False) -> dict[str, Any]:
    return {"a": a, "b": b, "c": c, "d": d}


def open_ended(ctx: StepContext, a: int, **rest: Any) -> dict[str, Any]:
    return {"a": a, **rest}


@pytest.fixture
def registry() -> ActionRegistry:
    reg = ActionRegistry()
    reg.register("sample", sample)
    reg.register("open.ended", open_ended)
    return reg


@pytest.fixture
def plugin_calls() -> Iterator[list[ActionRegistry]]:
    PLUGIN_CALLS.clear()
    yield PLUGIN_CALLS
    PLUGIN_CALLS.clear()


def test_decorator_registers_in_default_registry() -> None:
    @action("tests.decorated")
    def decorated(ctx: StepContext, x: int) -> int:
        return x * 2

    assert "tests.decorated" in REGISTRY.names()
    assert REGISTRY.get("tests.decorated") is decorated
    assert REGISTRY.call("tests.decorated", make_ctx(), {"x": 21}) == 42


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("noop", True),
        ("pubmed.search", True),
        ("a.b_c.d2", True),
        ("Pubmed.search", False),
        ("1abc", False),
        ("pubmed..search", False),
        ("pubmed.", False),
        (".search", False),
        ("pub-med", False),
        ("", False),
    ],
)
def test_name_pattern(name: str, ok: bool) -> None:
    reg = ActionRegistry()
    if ok:
        reg.register(name, sample)
        assert name in reg.names()
    else:
        with pytest.raises(ValueError, match="invalid action name"):
            reg.register(name, sample)


def test_duplicate_name_with_another_function_is_refused(registry: ActionRegistry) -> None:
    registry.register("sample", sample)
    with pytest.raises(ValueError, match="already registered"):
        registry.register("sample", open_ended)
    assert registry.get("sample") is sample


def test_function_without_context_argument_is_refused() -> None:
    def no_args() -> None:
        return None

    def keyword_only(*, ctx: StepContext) -> None:
        return None

    reg = ActionRegistry()
    for fn in (no_args, keyword_only):
        with pytest.raises(ValueError, match="first argument"):
            reg.register("bad", fn)


def test_unknown_action(registry: ActionRegistry) -> None:
    with pytest.raises(ActionNotFound) as info:
        registry.get("nope")
    assert info.value.code == "unknown_action"
    with pytest.raises(ActionNotFound):
        registry.call("nope", make_ctx(), {})
    with pytest.raises(ActionNotFound):
        registry.check_inputs("nope", [])


@pytest.mark.parametrize(
    ("name", "inputs", "problems"),
    [
        ("sample", {"a", "c"}, []),
        ("sample", {"a", "b", "c", "d"}, []),
        ("sample", {"c"}, ["missing required input 'a'"]),
        ("sample", set(), ["missing required input 'a'", "missing required input 'c'"]),
        ("sample", {"a", "c", "zzz", "yyy"}, ["unexpected input 'yyy'", "unexpected input 'zzz'"]),
        ("sample", {"ctx", "a", "c"}, ["input 'ctx' clashes with the context argument"]),
        ("open.ended", {"a", "anything", "else"}, []),
        ("open.ended", set(), ["missing required input 'a'"]),
    ],
)
def test_check_inputs(
    registry: ActionRegistry, name: str, inputs: set[str], problems: list[str]
) -> None:
    assert registry.check_inputs(name, inputs) == problems


def test_check_inputs_positional_only() -> None:
    def positional(ctx: StepContext, a: int, /, b: int = 0) -> int:
        return a + b

    reg = ActionRegistry()
    reg.register("positional", positional)
    assert reg.check_inputs("positional", {"b"}) == [
        "parameter 'a' is positional-only and cannot be given as an input"
    ]


def test_call_passes_context_and_inputs(registry: ActionRegistry) -> None:
    ctx = make_ctx()
    assert registry.call("sample", ctx, {"a": 1, "c": "x"}) == {
        "a": 1,
        "b": 1,
        "c": "x",
        "d": False,
    }
    assert registry.call("open.ended", ctx, {"a": 1, "z": [1]}) == {"a": 1, "z": [1]}


def test_call_with_bad_inputs_is_not_retryable(registry: ActionRegistry) -> None:
    with pytest.raises(ActionError) as info:
        registry.call("sample", make_ctx(), {"a": 1, "typo": 2})
    err = info.value
    assert err.retryable is False
    assert err.code == "action_failed"
    assert err.details["reason"] == "bad_inputs"
    assert err.details["problems"] == [
        "unexpected input 'typo'",
        "missing required input 'c'",
    ]


@pytest.mark.parametrize("output", [{1, 2}, object(), {"x": math.nan}, {"when": b"bytes"}])
def test_output_must_be_json(output: Any) -> None:
    reg = ActionRegistry()
    reg.register("bad.output", lambda ctx: output)
    with pytest.raises(ActionError) as info:
        reg.call("bad.output", make_ctx(), {})
    assert info.value.retryable is False
    assert info.value.details["reason"] == "output_not_json"


def test_errors_raised_by_the_action_propagate(registry: ActionRegistry) -> None:
    def boom(ctx: StepContext) -> None:
        raise ActionError("transient", retryable=True)

    registry.register("boom", boom)
    with pytest.raises(ActionError, match="transient") as info:
        registry.call("boom", make_ctx(), {})
    assert info.value.retryable is True


def test_load_plugins_imports_builtins_and_copies_into_another_registry() -> None:
    reg = ActionRegistry()
    load_plugins(reg, [], entry_points=[])
    expected = {
        "noop",
        "sleep",
        "fail",
        "text.stats",
        "http.request",
        "data.select",
        "data.filter",
        "data.flatten",
        "data.sort",
        "data.count",
        "data.load",
    }
    assert expected <= reg.names()
    assert expected <= REGISTRY.names()


def test_load_plugins_imports_named_modules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "flowbeat_test_plugin_mod.py").write_text(
        "from service.actions import action\n"
        "\n"
        "@action('tests.from_module')\n"
        "def from_module(ctx):\n"
        "    return 'ok'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "flowbeat_test_plugin_mod", raising=False)
    reg = ActionRegistry()
    load_plugins(reg, ["flowbeat_test_plugin_mod"], entry_points=[])
    assert reg.call("tests.from_module", make_ctx(), {}) == "ok"


def test_load_plugins_names_a_module_that_cannot_be_imported() -> None:
    with pytest.raises(ActionModuleUnimportable, match="no_such_flowbeat_module"):
        load_plugins(ActionRegistry(), ["no_such_flowbeat_module"], entry_points=[])


def _entry_point(name: str, value: str) -> metadata.EntryPoint:
    return metadata.EntryPoint(name=name, value=value, group="flowbeat.actions")


def test_entry_point_callable_is_called_with_registry_once(
    plugin_calls: list[ActionRegistry],
) -> None:
    reg = ActionRegistry()
    eps = [_entry_point("hello", "tests.service.actions.test_registry:register_plugin")]
    load_plugins(reg, [], entry_points=eps)
    load_plugins(reg, [], entry_points=eps)
    assert plugin_calls == [reg]
    assert reg.call("plugin.hello", make_ctx(), {"who": "lab"}) == "hello lab"
    assert "plugin.hello" not in REGISTRY.names()


def test_entry_point_module_is_imported_not_called(plugin_calls: list[ActionRegistry]) -> None:
    reg = ActionRegistry()
    load_plugins(reg, [], entry_points=[_entry_point("mod", "tests.service.actions.test_registry")])
    assert plugin_calls == []
    assert "noop" in reg.names()


def test_entry_point_that_cannot_load() -> None:
    eps = [_entry_point("broken", "no_such_flowbeat_pkg.actions:register")]
    with pytest.raises(ActionModuleUnimportable, match="broken"):
        load_plugins(ActionRegistry(), [], entry_points=eps)


def test_entry_points_are_discovered_by_group(
    monkeypatch: pytest.MonkeyPatch, plugin_calls: list[ActionRegistry]
) -> None:
    groups: list[str] = []

    def fake_entry_points(*, group: str) -> list[metadata.EntryPoint]:
        groups.append(group)
        return [_entry_point("hello", "tests.service.actions.test_registry:register_plugin")]

    monkeypatch.setattr(metadata, "entry_points", fake_entry_points)
    reg = ActionRegistry()
    load_plugins(reg, [])
    assert groups == ["flowbeat.actions"]
    assert "plugin.hello" in reg.names()


def test_load_plugins_on_default_registry_is_idempotent() -> None:
    load_plugins(REGISTRY, [], entry_points=[])
    before = REGISTRY.names()
    load_plugins(REGISTRY, [], entry_points=[])
    assert REGISTRY.names() == before
