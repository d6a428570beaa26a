import json
import os
from pathlib import Path
from typing import Any

import pytest

from service.actions import REGISTRY, StepContext, load_plugins
from service.actions import data as data_module
from service.platform.errors import ActionError
from tests.service.actions import make_ctx

PROFILES_DIR = Path(__file__).resolve().parents[3] / "profiles"

ITEMS: list[dict[str, Any]] = [
    {"id": "a", "year": 2019, "title": "CRISPR base editing", "tags": ["crispr"], "m": {"n": 3}},
    {"id": "b", "year": 2023, "title": "Remimazolam sedation", "tags": ["icu"], "m": {"n": 1}},
    {"id": "c", "year": 2021, "title": "Prime editing", "tags": ["crispr", "organoid"]},
    {"id": "d", "year": None, "title": "Undated"},
]


@pytest.fixture(scope="module", autouse=True)
def _builtins() -> None:
    load_plugins(REGISTRY, [], entry_points=[])


def call(name: str, ctx: StepContext | None = None, **inputs: Any) -> Any:
    return REGISTRY.call(name, ctx or make_ctx(), inputs)


def ids(rows: list[dict[str, Any]]) -> list[str]:
    return [row["id"] for row in rows]


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (["id"], [{"id": "a"}, {"id": "b"}, {"id": "c"}, {"id": "d"}]),
        ("id", [{"id": "a"}, {"id": "b"}, {"id": "c"}, {"id": "d"}]),
        (
            ["id", "m.n"],
            [{"id": "a", "m.n": 3}, {"id": "b", "m.n": 1}, {"id": "c"}, {"id": "d"}],
        ),
        (["tags.0"], [{"tags.0": "crispr"}, {"tags.0": "icu"}, {"tags.0": "crispr"}, {}]),
        (["year"], [{"year": 2019}, {"year": 2023}, {"year": 2021}, {"year": None}]),
    ],
)
def test_select(fields: Any, expected: list[dict[str, Any]]) -> None:
    assert call("data.select", items=ITEMS, fields=fields) == expected


@pytest.mark.parametrize(
    ("field", "op", "value", "expected"),
    [
        ("id", "eq", "b", ["b"]),
        ("id", "ne", "b", ["a", "c", "d"]),
        ("year", "gt", 2019, ["b", "c"]),
        ("year", "gte", 2021, ["b", "c"]),
        ("year", "lt", 2021, ["a"]),
        ("year", "lte", 2021, ["a", "c"]),
        ("year", "gt", "2019", []),
        ("title", "lt", "Q", ["a", "c"]),
        ("id", "in", ["a", "d", "z"], ["a", "d"]),
        ("tags", "contains", "crispr", ["a", "c"]),
        ("title", "contains", "editing", ["a", "c"]),
        ("m", "contains", "n", ["a", "b"]),
        ("m.n", "eq", 1, ["b"]),
        ("tags", "exists", None, ["a", "b", "c"]),
        ("year", "exists", True, ["a", "b", "c"]),
        ("year", "exists", False, ["d"]),
        ("missing", "eq", None, []),
        ("missing", "ne", 1, ["a", "b", "c", "d"]),
    ],
)
def test_filter(field: str, op: str, value: Any, expected: list[str]) -> None:
    assert ids(call("data.filter", items=ITEMS, field=field, op=op, value=value)) == expected


def test_filter_exists_needs_no_value() -> None:
    assert ids(call("data.filter", items=ITEMS, field="m", op="exists")) == ["a", "b"]


@pytest.mark.parametrize(
    ("op", "value"),
    [("like", "x"), ("", 1), ("in", "abc"), ("gt", None), ("lt", [1])],
)
def test_filter_bad_op_or_value(op: str, value: Any) -> None:
    with pytest.raises(ActionError) as info:
        call("data.filter", items=ITEMS, field="year", op=op, value=value)
    assert info.value.retryable is False


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        ([], []),
        ([[1, 2], [3], []], [1, 2, 3]),
        ([[[1]], [2]], [[1], 2]),
        ([[1], 2, {"a": 1}], [1, 2, {"a": 1}]),
    ],
)
def test_flatten(items: list[Any], expected: list[Any]) -> None:
    assert call("data.flatten", items=items) == expected


@pytest.mark.parametrize(
    ("field", "descending", "expected"),
    [
        ("year", False, ["a", "c", "b", "d"]),
        ("year", True, ["b", "c", "a", "d"]),
        ("title", False, ["a", "c", "b", "d"]),
        ("m.n", False, ["b", "a", "c", "d"]),
        ("m.n", True, ["a", "b", "c", "d"]),
    ],
)
def test_sort(field: str, descending: bool, expected: list[str]) -> None:
    rows = call("data.sort", items=ITEMS, field=field, descending=descending)
    assert ids(rows) == expected


def test_sort_is_stable_and_groups_mixed_types() -> None:
    items = [{"k": "b"}, {"k": 2}, {"k": 1, "i": 0}, {"k": 1, "i": 1}, {"k": "a"}, {}]
    assert call("data.sort", items=items, field="k") == [
        {"k": 1, "i": 0},
        {"k": 1, "i": 1},
        {"k": 2},
        {"k": "a"},
        {"k": "b"},
        {},
    ]


@pytest.mark.parametrize(("items", "n"), [([], 0), (ITEMS, 4), ([[1, 2]], 1)])
def test_count(items: list[Any], n: int) -> None:
    assert call("data.count", items=items) == {"count": n}


@pytest.mark.parametrize(
    ("name", "inputs"),
    [
        ("data.select", {"items": {"a": 1}, "fields": ["a"]}),
        ("data.select", {"items": [1], "fields": ["a"]}),
        ("data.select", {"items": [], "fields": [1]}),
        ("data.filter", {"items": "x", "field": "a", "op": "eq", "value": 1}),
        ("data.flatten", {"items": None}),
        ("data.sort", {"items": {}, "field": "a"}),
        ("data.count", {"items": 3}),
    ],
)
def test_items_must_be_lists(name: str, inputs: dict[str, Any]) -> None:
    with pytest.raises(ActionError) as info:
        REGISTRY.call(name, make_ctx(), inputs)
    assert info.value.retryable is False


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    base = tmp_path / "profiles"
    (base / "data").mkdir(parents=True)
    (base / "data" / "rows.json").write_text(json.dumps([{"a": 1}, {"a": 2}]))
    (base / "data" / "rows.jsonl").write_text('{"a": 1}\n\n{"a": 2}\n')
    (base / "data" / "rows.csv").write_text("a,b\n1,x\n2,y\n", encoding="utf-8-sig")
    (base / "data" / "rows.txt").write_text('[{"a": 1}]')
    (base / "data" / "object.json").write_text('{"a": 1}')
    (base / "data" / "broken.jsonl").write_text('{"a": 1}\nnot json\n')
    (tmp_path / "secret.json").write_text('[{"secret": true}]')
    return base


@pytest.mark.parametrize(
    ("path", "fmt", "expected"),
    [
        ("data/rows.json", None, [{"a": 1}, {"a": 2}]),
        ("data/rows.jsonl", None, [{"a": 1}, {"a": 2}]),
        ("data/rows.csv", None, [{"a": "1", "b": "x"}, {"a": "2", "b": "y"}]),
        ("data/rows.txt", "json", [{"a": 1}]),
        ("./data/rows.json", "JSON", [{"a": 1}, {"a": 2}]),
    ],
)
def test_load(data_dir: Path, path: str, fmt: str | None, expected: list[Any]) -> None:
    ctx = make_ctx(profiles_dir=data_dir)
    assert call("data.load", ctx, path=path, format=fmt) == expected


@pytest.mark.parametrize(
    ("path", "fmt", "reason"),
    [
        ("../secret.json", None, "bad_path"),
        ("data/../../secret.json", None, "bad_path"),
        ("/etc/passwd", "csv", "bad_path"),
        ("C:\\Windows\\win.ini", "csv", "bad_path"),
        ("", "json", "bad_path"),
        ("data", "json", "bad_path"),
        ("data/absent.json", None, "not_found"),
        ("data/object.json", None, "bad_data"),
        ("data/broken.jsonl", None, "bad_data"),
        ("data/rows.txt", None, "bad_inputs"),
        ("data/rows.json", "xml", "bad_inputs"),
    ],
)
def test_load_refuses(data_dir: Path, path: str, fmt: str | None, reason: str) -> None:
    ctx = make_ctx(profiles_dir=data_dir)
    with pytest.raises(ActionError) as info:
        call("data.load", ctx, path=path, format=fmt)
    assert info.value.retryable is False
    assert info.value.details["reason"] == reason


def test_load_refuses_symlink_out_of_the_dir(data_dir: Path, tmp_path: Path) -> None:
    os.symlink(tmp_path / "secret.json", data_dir / "data" / "link.json")
    os.symlink(tmp_path, data_dir / "up")
    ctx = make_ctx(profiles_dir=data_dir)
    for path in ("data/link.json", "up/secret.json"):
        with pytest.raises(ActionError) as info:
            call("data.load", ctx, path=path)
        assert info.value.details["reason"] == "bad_path"


def test_load_follows_symlink_inside_the_dir(data_dir: Path) -> None:
    os.symlink(data_dir / "data" / "rows.json", data_dir / "alias.json")
    ctx = make_ctx(profiles_dir=data_dir)
    assert call("data.load", ctx, path="alias.json") == [{"a": 1}, {"a": 2}]


def test_load_size_cap(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data_module, "MAX_LOAD_BYTES", 10)
    with pytest.raises(ActionError) as info:
        call("data.load", make_ctx(profiles_dir=data_dir), path="data/rows.json")
    assert info.value.details["reason"] == "too_large"


def test_shipped_papers() -> None:
    ctx = make_ctx(profiles_dir=PROFILES_DIR)
    papers = call("data.load", ctx, path="data/papers.jsonl")
    assert len(papers) == 24
    assert len({p["pmid"] for p in papers}) == 24
    for paper in papers:
        assert set(paper) == {"pmid", "title", "year", "journal", "abstract", "tags"}
        assert isinstance(paper["pmid"], str) and paper["pmid"].isdigit()
        assert isinstance(paper["year"], int) and 2015 <= paper["year"] <= 2025
        assert isinstance(paper["tags"], list) and paper["tags"]
        assert paper["abstract"]
    assert {p["year"] for p in papers} == set(range(2015, 2026))
    crispr = call("data.filter", items=papers, field="tags", op="contains", value="crispr")
    sedation = call("data.filter", items=papers, field="tags", op="contains", value="remimazolam")
    assert len(crispr) >= 8 and len(sedation) >= 4


def test_demo_pipeline_shape() -> None:
    ctx = make_ctx(profiles_dir=PROFILES_DIR)
    papers = call("data.load", ctx, path="data/papers.jsonl")
    stats = [call("text.stats", text=p["abstract"]) for p in papers]
    assert all(s["words"] > 10 for s in stats)
    recent = call("data.filter", items=papers, field="year", op="gte", value=2022)
    keys = call("data.select", items=recent, fields=["pmid"])
    assert keys and all(set(k) == {"pmid"} for k in keys)
    assert call("data.count", items=keys)["count"] == len(recent)
