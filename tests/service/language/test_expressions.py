from typing import Any

import pytest

from service.language.expressions import NO_ITEM, ExprContext, Ref, parse_refs, resolve, whole_ref
from service.platform.errors import ExpressionError


@pytest.mark.parametrize(
    ("value", "refs"),
    [
        pytest.param("plain text", [], id="no-refs"),
        pytest.param("${{ params.q }}", [Ref("params", "q", ())], id="param"),
        pytest.param("${{params.q}}", [Ref("params", "q", ())], id="no-spaces"),
        pytest.param("${{\n  params.q\t}}", [Ref("params", "q", ())], id="any-whitespace"),
        pytest.param("${{ params.q.a-b._c }}", [Ref("params", "q", ("a-b", "_c"))], id="idents"),
        pytest.param("${{ steps.s1.output }}", [Ref("steps", "s1", ())], id="whole-output"),
        pytest.param(
            "${{ steps.s1.output.ids[0].x.2 }}",
            [Ref("steps", "s1", ("ids", 0, "x", 2))],
            id="output-path-with-indices",
        ),
        pytest.param("${{ item }}", [Ref("item", None, ())], id="item"),
        pytest.param("${{ item.doi }}", [Ref("item", None, ("doi",))], id="item-path"),
        pytest.param("${{ item[1] }}", [Ref("item", None, (1,))], id="item-index"),
        pytest.param(
            {"a": ["x ${{ params.a }} y ${{ item }}"], "b": {"c": "${{ steps.s.output }}"}, "n": 3},
            [Ref("params", "a", ()), Ref("item", None, ()), Ref("steps", "s", ())],
            id="nested",
        ),
    ],
)
def test_parse_refs(value: Any, refs: list[Ref]) -> None:
    assert parse_refs(value) == refs


@pytest.mark.parametrize(
    "expression",
    [
        pytest.param("${{ __import__('os') }}", id="call"),
        pytest.param("${{ params.a + 1 }}", id="operator"),
        pytest.param("${{ steps.x.output | upper }}", id="filter"),
        pytest.param("${{ params.a.upper() }}", id="method-call"),
        pytest.param("${{ }}", id="empty"),
        pytest.param("${{ params }}", id="params-without-name"),
        pytest.param("${{ params[0] }}", id="params-index-name"),
        pytest.param("${{ steps.x }}", id="step-without-output"),
        pytest.param("${{ steps.x.result }}", id="step-not-output"),
        pytest.param("${{ items }}", id="unknown-root"),
        pytest.param("${{ env.HOME }}", id="env"),
        pytest.param("${{ params.a[-1] }}", id="negative-index"),
        pytest.param("${{ params.a['k'] }}", id="string-subscript"),
        pytest.param("${{ params.a..b }}", id="empty-segment"),
        pytest.param("${{ params.a", id="unterminated"),
        pytest.param("x ${{ params.a }} ${{ params.b", id="unterminated-after-good"),
        pytest.param("${{ params.${{ params.a }} }}", id="nested"),
    ],
)
def test_parse_refs_rejects(expression: str) -> None:
    with pytest.raises(ExpressionError) as info:
        parse_refs({"k": [expression]})
    assert "expression" in info.value.details
    assert info.value.code == "bad_reference"


@pytest.mark.parametrize(
    "ref",
    [
        Ref("params", "q", ()),
        Ref("steps", "s1", ("ids", 0, "x-y")),
        Ref("item", None, ()),
        Ref("item", None, (3, "a")),
    ],
)
def test_ref_str_round_trips(ref: Ref) -> None:
    assert parse_refs(str(ref)) == [ref]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("${{ params.q }}", Ref("params", "q", ())),
        ("  ${{ params.q }}\n", Ref("params", "q", ())),
        ("x${{ params.q }}", None),
        ("${{ params.q }}${{ params.r }}", None),
        ("no ref", None),
    ],
)
def test_whole_ref(text: str, expected: Ref | None) -> None:
    assert whole_ref(text) == expected


CTX = ExprContext(
    params={"q": "crispr", "n": 5, "tags": ["a", "b"], "opt": None, "cfg": {"k": {"v": 1}}},
    outputs={"search": {"ids": [10, 20, 30], "meta": {"total": 3}}, "empty": None},
    item={"doi": "10.1/x", "n": 2},
)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("${{ params.q }}", "crispr", id="string"),
        pytest.param("${{ params.n }}", 5, id="int-keeps-type"),
        pytest.param("  ${{ params.tags }} ", ["a", "b"], id="list-whole-ignoring-blanks"),
        pytest.param("${{ params.opt }}", None, id="none"),
        pytest.param("${{ params.cfg.k.v }}", 1, id="nested-key"),
        pytest.param("${{ steps.search.output }}", CTX.outputs["search"], id="whole-output"),
        pytest.param("${{ steps.search.output.ids[1] }}", 20, id="bracket-index"),
        pytest.param("${{ steps.search.output.ids.2 }}", 30, id="dot-index"),
        pytest.param("${{ steps.empty.output }}", None, id="null-output"),
        pytest.param("${{ item.doi }}", "10.1/x", id="item"),
        pytest.param("q=${{ params.q }}&n=${{ params.n }}", "q=crispr&n=5", id="interpolate"),
        pytest.param("t=${{ params.tags }}", 't=["a","b"]', id="interpolate-compact-json"),
        pytest.param("v=${{ params.opt }}", "v=null", id="interpolate-null"),
        pytest.param("${{ params.q }}${{ params.n }}", "crispr5", id="two-refs-no-gap"),
        pytest.param(
            {"a": ["${{ params.n }}", {"b": "${{ item.n }}"}], "c": True, "d": 1.5},
            {"a": [5, {"b": 2}], "c": True, "d": 1.5},
            id="deep",
        ),
        pytest.param("no refs $ { {", "no refs $ { {", id="plain"),
    ],
)
def test_resolve(value: Any, expected: Any) -> None:
    assert resolve(value, CTX) == expected


def test_resolve_does_not_mutate_input() -> None:
    value = {"a": ["${{ params.q }}"]}
    resolve(value, CTX)
    assert value == {"a": ["${{ params.q }}"]}


@pytest.mark.parametrize(
    ("value", "reason_part"),
    [
        pytest.param("${{ params.missing }}", "no param", id="missing-param"),
        pytest.param("${{ steps.nope.output }}", "no output", id="missing-step"),
        pytest.param("${{ params.cfg.zz }}", "no key", id="missing-key"),
        pytest.param("${{ steps.search.output.ids[9] }}", "out of range", id="bad-index"),
        pytest.param("${{ params.q.x }}", "cannot take", id="key-of-string"),
        pytest.param("${{ params.tags.x }}", "cannot take", id="key-of-list"),
        pytest.param("x ${{ steps.empty.output.a }}", "cannot take", id="key-of-null"),
    ],
)
def test_resolve_errors(value: str, reason_part: str) -> None:
    with pytest.raises(ExpressionError) as info:
        resolve({"k": value}, CTX)
    assert set(info.value.details) == {"expression", "reason"}
    assert reason_part in info.value.details["reason"]


def test_item_without_fan_out_is_an_error() -> None:
    ctx = ExprContext(params={}, outputs={})
    assert ctx.item is NO_ITEM
    with pytest.raises(ExpressionError, match="for_each"):
        resolve("${{ item }}", ctx)


def test_none_item_is_a_real_item() -> None:
    assert resolve("${{ item }}", ExprContext(params={}, outputs={}, item=None)) is None


def test_resolve_rejects_code() -> None:
    with pytest.raises(ExpressionError):
        resolve("${{ __import__('os').system('true') }}", CTX)


def test_a_scheduled_job_reads_its_fire_time() -> None:
    ctx = ExprContext(params={}, outputs={}, schedule={"fire_time": "2026-01-05T08:00:00+00:00"})
    assert resolve("since ${{ schedule.fire_time }}", ctx) == "since 2026-01-05T08:00:00+00:00"


def test_a_job_nothing_scheduled_has_no_fire_time() -> None:
    with pytest.raises(ExpressionError, match="only defined in a job a schedule"):
        resolve("${{ schedule.fire_time }}", ExprContext(params={}, outputs={}))


def test_a_job_whose_schedule_is_gone_has_no_previous_fire_time() -> None:
    ctx = ExprContext(params={}, outputs={}, schedule={"fire_time": "2026-01-05T08:00:00+00:00"})
    with pytest.raises(ExpressionError, match="schedule is gone"):
        resolve("${{ schedule.previous_fire_time }}", ctx)


@pytest.mark.parametrize("expression", ["${{ schedule }}", "${{ schedule.next_time }}"])
def test_the_schedule_offers_its_fire_time_only(expression: str) -> None:
    with pytest.raises(ExpressionError, match=r"schedule\."):
        parse_refs(expression)
