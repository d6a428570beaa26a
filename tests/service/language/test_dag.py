from collections.abc import Mapping

import pytest

from service.language.dag import CycleError, UnknownDependency, ancestors, topological_layers

Deps = Mapping[str, list[str]]

DIAMOND: Deps = {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}


@pytest.mark.parametrize(
    ("deps", "layers"),
    [
        pytest.param({}, [], id="empty"),
        pytest.param({"a": []}, [["a"]], id="single"),
        pytest.param(DIAMOND, [["a"], ["b", "c"], ["d"]], id="diamond"),
        pytest.param({"c": ["b"], "b": ["a"], "a": []}, [["a"], ["b"], ["c"]], id="chain"),
        pytest.param({"x": [], "z": [], "y": []}, [["x", "z", "y"]], id="independent"),
        pytest.param(
            {"a": [], "b": ["a"], "c": ["b"], "d": ["a"]},
            [["a"], ["b", "d"], ["c"]],
            id="layer-is-longest-path",
        ),
        pytest.param(
            {"late": ["early"], "solo": [], "early": []},
            [["solo", "early"], ["late"]],
            id="input-order-within-layer",
        ),
        pytest.param(
            {f"n{i}": [f"n{i - 1}"] if i else [] for i in range(3000)},
            [[f"n{i}"] for i in range(3000)],
            id="long-chain-no-recursion-limit",
        ),
    ],
)
def test_topological_layers(deps: Deps, layers: list[list[str]]) -> None:
    assert topological_layers(deps) == layers


@pytest.mark.parametrize(
    ("deps", "cycle"),
    [
        pytest.param({"a": ["a"]}, ["a", "a"], id="self-cycle"),
        pytest.param({"a": ["b"], "b": ["a"]}, ["a", "b", "a"], id="two-cycle"),
        pytest.param(
            {"a": ["e"], "b": ["a"], "c": ["b"], "d": ["c"], "e": ["d"]},
            ["a", "e", "d", "c", "b", "a"],
            id="long-cycle",
        ),
        pytest.param(
            {"root": [], "x": ["root", "y"], "y": ["x"]}, ["x", "y", "x"], id="cycle-off-root"
        ),
    ],
)
def test_cycles(deps: Deps, cycle: list[str]) -> None:
    with pytest.raises(CycleError) as info:
        topological_layers(deps)
    assert info.value.cycle == cycle
    assert " -> ".join(cycle) in str(info.value)


def test_unknown_dependency() -> None:
    with pytest.raises(UnknownDependency) as info:
        topological_layers({"a": [], "b": ["a", "zz"]})
    assert (info.value.node, info.value.missing) == ("b", "zz")
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("deps", "node", "expected"),
    [
        pytest.param(DIAMOND, "d", {"a", "b", "c"}, id="diamond-sink"),
        pytest.param(DIAMOND, "b", {"a"}, id="diamond-middle"),
        pytest.param(DIAMOND, "a", set(), id="root"),
        pytest.param({"a": [], "b": ["a"], "c": ["b"]}, "c", {"a", "b"}, id="transitive"),
        pytest.param({"a": [], "b": []}, "b", set(), id="independent"),
        pytest.param({"a": ["b"], "b": ["a"]}, "a", {"a", "b"}, id="cycle-includes-self"),
    ],
)
def test_ancestors(deps: Deps, node: str, expected: set[str]) -> None:
    assert ancestors(deps, node) == expected
