import ast
import contextlib
import math
import operator
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.language import conditions
from service.language.conditions import (
    MAX_DEPTH,
    MAX_LENGTH,
    MAX_LIST_ITEMS,
    evaluate,
    parse_condition,
    truthy,
)
from service.language.expressions import ExprContext, Ref
from service.platform.errors import ConditionInvalid, ExpressionError

ALL = frozenset({"params", "steps", "item", "output"})
WHEN = frozenset({"params", "steps"})

CTX = ExprContext(
    params={"mode": "full", "n": 3, "tags": ["a", "b"], "none": None, "cfg": {"k": 1}},
    outputs={"review": {"approved": True, "score": 0.5, "notes": ""}},
    item={"doi": "10.1/x"},
    output={"items": [1, 2], "total": 2, "empty": []},
)


def holds(text: str, ctx: ExprContext = CTX) -> bool:
    return evaluate(parse_condition(text, roots=ALL), ctx)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("${{ params.mode }} == 'full'", True, id="param-equals-string"),
        pytest.param('${{ params.mode }} != "full"', False, id="double-quotes"),
        pytest.param("${{ steps.review.output.approved }}", True, id="bare-ref-truthy"),
        pytest.param("${{ steps.review.output.notes }}", False, id="empty-string-falsy"),
        pytest.param("${{ params.none }}", False, id="null-falsy"),
        pytest.param("${{ output.empty }}", False, id="empty-list-falsy"),
        pytest.param("${{ output.items }}", True, id="list-truthy"),
        pytest.param("${{ params.cfg }}", True, id="object-truthy"),
        pytest.param("0", False, id="zero-falsy"),
        pytest.param("0.0", False, id="float-zero-falsy"),
        pytest.param("-1", True, id="negative-truthy"),
        pytest.param("null", False, id="null-literal"),
        pytest.param("true", True, id="true-literal"),
        pytest.param("[]", False, id="empty-list-literal"),
        pytest.param("${{ output.total }} >= 2", True, id="ge"),
        pytest.param("${{ output.total }} > 2", False, id="gt"),
        pytest.param("${{ steps.review.output.score }} < 1", True, id="float-lt-int"),
        pytest.param("${{ params.n }} <= 3.0", True, id="int-le-float"),
        pytest.param("1e3 == 1000", True, id="exponent"),
        pytest.param("'abc' < 'abd'", True, id="strings-order"),
        pytest.param("${{ params.mode }} in ['full', 'quick']", True, id="in-list"),
        pytest.param("'c' not in ${{ params.tags }}", True, id="not-in-list"),
        pytest.param("'ul' in ${{ params.mode }}", True, id="substring"),
        pytest.param("'k' in ${{ params.cfg }}", True, id="object-key"),
        pytest.param("[1, 'a'] == [1.0, \"a\"]", True, id="list-equality"),
        pytest.param("true == 1", False, id="bool-is-not-number"),
        pytest.param("false == 0", False, id="false-is-not-zero"),
        pytest.param("1 in [true]", False, id="membership-is-json-equality"),
        pytest.param("null == null", True, id="null-equals-null"),
        pytest.param("'1' == 1", False, id="string-is-not-number"),
        pytest.param("${{ item.doi }} == '10.1/x'", True, id="item"),
        pytest.param("not ${{ params.none }}", True, id="not"),
        pytest.param("not not 1", True, id="not-not"),
        pytest.param("not 1 == 2", True, id="not-binds-looser-than-comparison"),
        pytest.param("true or false and false", True, id="and-binds-tighter-than-or"),
        pytest.param("(true or false) and false", False, id="parentheses"),
        pytest.param("false and ${{ params.missing }}", False, id="and-short-circuits"),
        pytest.param("true or ${{ params.missing }} > 'x'", True, id="or-short-circuits"),
        pytest.param("(1 or 2) == true", True, id="or-gives-a-boolean"),
        pytest.param("'it\\'s' == \"it's\"", True, id="escaped-quote"),
        pytest.param("'a\\\\b' == \"a\\\\b\"", True, id="escaped-backslash"),
        pytest.param("'\\n' != 'n'", True, id="escaped-newline"),
        pytest.param("${{ params.cfg.__class__ }} == 1", None, id="dunder-is-a-key"),
    ],
)
def test_evaluate(text: str, expected: bool | None) -> None:
    if expected is None:
        with pytest.raises(ExpressionError, match="no key '__class__'"):
            holds(text)
    else:
        assert holds(text) is expected


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        pytest.param("", "empty condition", id="empty"),
        pytest.param("   ", "empty condition", id="blank"),
        pytest.param("__import__('os')", "unknown word '__import__'", id="import"),
        pytest.param("().__class__", "unexpected character '.'", id="dunder-attribute"),
        pytest.param("lambda: 1", "unknown word 'lambda'", id="lambda"),
        pytest.param("f'{1}'", "unknown word 'f'", id="f-string"),
        pytest.param("open('/etc/passwd')", "unknown word 'open'", id="call"),
        pytest.param("params.mode == 'x'", "unknown word 'params'", id="bare-reference"),
        pytest.param("${{ params.mode }}.upper()", "unexpected character '.'", id="method"),
        pytest.param("${{ params.mode.upper() }}", "unexpected '()'", id="call-in-ref"),
        pytest.param("1 + 1", "unexpected character '+'", id="arithmetic"),
        pytest.param("True", "write 'true', not 'True'", id="python-true"),
        pytest.param("None == null", "write 'null', not 'None'", id="python-none"),
        pytest.param("1 < 2 < 3", "comparisons do not chain", id="chain"),
        pytest.param("1 == 1 != 2", "comparisons do not chain", id="chain-equality"),
        pytest.param("(true", "expected ')', found the end", id="unclosed-paren"),
        pytest.param("true)", "expected an operator, found ')'", id="stray-paren"),
        pytest.param("[1, 2", "expected ',' or ']', found the end", id="unclosed-list"),
        pytest.param("[1, ]", "expected a value, found ']'", id="trailing-comma"),
        pytest.param("{'a': 1}", "unexpected character '{'", id="object-literal"),
        pytest.param("'abc", "unterminated string", id="unterminated-string"),
        pytest.param("'a\\x'", "unknown escape", id="unknown-escape"),
        pytest.param("'a\\", "unknown escape", id="trailing-backslash"),
        pytest.param("1e999 > 1", "out of range", id="infinite-float"),
        pytest.param("1 ==", "expected a value, found the end", id="missing-right"),
        pytest.param("and true", "expected a value, found 'and'", id="leading-and"),
        pytest.param("true true", "expected an operator, found 'true'", id="two-values"),
        pytest.param("${{ params.mode", "unterminated '${{'", id="unterminated-ref"),
        pytest.param("${{ params.${{ params.a }} }}", "nested '${{'", id="nested-ref"),
        pytest.param("${{ env.HOME }}", "must start with", id="unknown-root"),
        pytest.param("${{ steps.x }}", "steps.ID.output", id="step-without-output"),
        pytest.param("a" * (MAX_LENGTH + 1), f"the limit is {MAX_LENGTH}", id="too-long"),
        pytest.param(
            "(" * (MAX_DEPTH + 1) + "1" + ")" * (MAX_DEPTH + 1), "nested more than", id="deep"
        ),
        pytest.param("not " * (MAX_DEPTH + 1) + "1", "nested more than", id="deep-not"),
        pytest.param("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "nested more", id="deep-list"),
        pytest.param(
            "[" + ",".join(["1"] * (MAX_LIST_ITEMS + 1)) + "]",
            f"at most {MAX_LIST_ITEMS} items",
            id="long-list",
        ),
    ],
)
def test_parse_refuses(text: str, reason: str) -> None:
    with pytest.raises(ConditionInvalid) as info:
        parse_condition(text, roots=ALL)
    assert info.value.code == "condition_invalid"
    assert reason in info.value.details["reason"]
    assert info.value.details["expression"] == text


@pytest.mark.parametrize(
    ("text", "roots", "allowed"),
    [
        pytest.param("${{ output.items }}", WHEN, False, id="output-outside-verify"),
        pytest.param("${{ output.items }}", frozenset({"output"}), True, id="output-allowed"),
        pytest.param("${{ item }}", WHEN, False, id="item-not-allowed"),
        pytest.param("${{ steps.a.output }}", frozenset({"output", "params"}), False, id="steps"),
        pytest.param("'${{ output }}' == 'x'", WHEN, True, id="inside-a-string-is-text"),
    ],
)
def test_roots_are_the_callers_choice(text: str, roots: frozenset[str], allowed: bool) -> None:
    if allowed:
        parse_condition(text, roots=roots)
    else:
        with pytest.raises(ConditionInvalid, match="must start with"):
            parse_condition(text, roots=roots)


def test_the_limits_admit_what_they_name() -> None:
    parse_condition("(" * MAX_DEPTH + "1" + ")" * MAX_DEPTH, roots=ALL)
    parse_condition("[" + ",".join(["1"] * MAX_LIST_ITEMS) + "]", roots=ALL)
    long_chain = " and ".join(["1"] * 160)
    assert len(long_chain) <= MAX_LENGTH and holds(long_chain)


@pytest.mark.parametrize(
    ("text", "refs"),
    [
        pytest.param("true", [], id="none"),
        pytest.param(
            "${{ params.a }} in [${{ steps.s.output.x[0] }}, 1] or not ${{ params.a }}",
            [
                Ref("params", "a", ()),
                Ref("steps", "s", ("x", 0)),
                Ref("params", "a", ()),
            ],
            id="source-order-with-repeats",
        ),
        pytest.param(
            "${{ output }} and ${{ item.k }}",
            [Ref("output", None, ()), Ref("item", None, ("k",))],
            id="roots",
        ),
    ],
)
def test_refs(text: str, refs: list[Ref]) -> None:
    assert parse_condition(text, roots=ALL).refs() == refs


@pytest.mark.parametrize(
    ("text", "error", "part"),
    [
        pytest.param(
            "'a' < 1", ConditionInvalid, "cannot order a string and a number", id="str-int"
        ),
        pytest.param("[1] < [2]", ConditionInvalid, "cannot order a list and a list", id="lists"),
        pytest.param("true < 2", ConditionInvalid, "a boolean and a number", id="bool-int"),
        pytest.param("null >= 0", ConditionInvalid, "a null and a number", id="null"),
        pytest.param("1 in 'abc'", ConditionInvalid, "got a number in a string", id="in-str"),
        pytest.param("'a' in 5", ConditionInvalid, "in a number", id="in-number"),
        pytest.param("1 in ${{ params.cfg }}", ConditionInvalid, "in a object", id="in-obj"),
        pytest.param("${{ params.missing }}", ExpressionError, "no param 'missing'", id="param"),
        pytest.param("${{ output.nope }} == 1", ExpressionError, "no key 'nope'", id="key"),
        pytest.param("${{ steps.x.output }}", ExpressionError, "no output for step", id="step"),
    ],
)
def test_evaluate_refuses(text: str, error: type[ExpressionError], part: str) -> None:
    condition = parse_condition(text, roots=ALL)
    with pytest.raises(error) as info:
        evaluate(condition, CTX)
    assert part in info.value.message


@pytest.mark.parametrize(
    ("ctx", "text", "part"),
    [
        pytest.param(ExprContext({}, {}), "${{ output }}", "'output' is only defined", id="output"),
        pytest.param(ExprContext({}, {}), "${{ item }}", "'item' is only defined", id="item"),
    ],
)
def test_roots_missing_from_the_context_do_not_resolve(
    ctx: ExprContext, text: str, part: str
) -> None:
    with pytest.raises(ExpressionError, match=part):
        holds(text, ctx)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, False),
        (False, False),
        (0, False),
        (0.0, False),
        ("", False),
        ([], False),
        ({}, False),
        (True, True),
        (-2, True),
        ("0", True),
        ([0], True),
        ({"a": None}, True),
    ],
)
def test_truthy_is_json_truthiness(value: Any, expected: bool) -> None:
    assert truthy(value) is expected


def test_the_module_has_no_way_to_run_code() -> None:
    """The grammar is the guarantee; this keeps a later change from adding a shortcut."""
    tree = ast.parse(Path(conditions.__file__).read_text())
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    attributes = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    builtins = {"eval", "exec", "compile", "getattr", "__import__", "globals", "vars"}
    assert not names & builtins
    assert not attributes & {"literal_eval", "import_module", "__dict__", "__class__"}
    assert not {"ast", "importlib", "builtins"} & imported


# Properties. A generated condition is a tree, rendered to text for the parser and evaluated
# directly by the small reference below, which follows the documented rules independently.

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-1000, 1000),
    st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
)
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=3))
PARAMS = st.dictionaries(st.sampled_from(["a", "b", "c"]), VALUES, min_size=3)
ORDER: dict[str, Callable[[Any, Any], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
COMPARE = ["==", "!=", *ORDER, "in", "not in"]


class Incompatible(Exception):
    pass


def canon(value: Any) -> Any:
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int | float):
        return ("number", float(value))
    if isinstance(value, list):
        return ("list", tuple(canon(v) for v in value))
    return (type(value).__name__, value)


def ref_compare(op: str, left: Any, right: Any) -> bool:
    if op in ("==", "!="):
        same: bool = canon(left) == canon(right)
        return same == (op == "==")
    if op in ("in", "not in"):
        if isinstance(right, list):
            found = canon(left) in [canon(v) for v in right]
        elif isinstance(right, str) and isinstance(left, str):
            found = left in right
        else:
            raise Incompatible
        return found == (op == "in")
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (left, right))
    if not numbers and not (isinstance(left, str) and isinstance(right, str)):
        raise Incompatible
    return ORDER[op](left, right)


def ref_eval(tree: Any, params: dict[str, Any]) -> Any:
    kind = tree[0]
    if kind == "const":
        return tree[1]
    if kind == "param":
        return params[tree[1]]
    if kind == "list":
        return [ref_eval(item, params) for item in tree[1]]
    if kind == "not":
        return not bool(ref_eval(tree[1], params))
    if kind == "and":
        return bool(ref_eval(tree[1], params)) and bool(ref_eval(tree[2], params))
    if kind == "or":
        return bool(ref_eval(tree[1], params)) or bool(ref_eval(tree[2], params))
    return ref_compare(tree[1], ref_eval(tree[2], params), ref_eval(tree[3], params))


def render_scalar(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, int | float):
        return repr(value)
    assert isinstance(value, str)
    escaped = value.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n")
    return "'" + escaped.replace("\r", "\\r").replace("\t", "\\t") + "'"


def render(tree: Any) -> str:
    kind = tree[0]
    if kind == "const":
        return render_scalar(tree[1])
    if kind == "param":
        return f"${{{{ params.{tree[1]} }}}}"
    if kind == "list":
        return "[" + ", ".join(render(item) for item in tree[1]) + "]"
    if kind == "not":
        return f"not ({render(tree[1])})"
    if kind in ("and", "or"):
        return f"({render(tree[1])}) {kind} ({render(tree[2])})"
    return f"({render(tree[2])}) {tree[1]} ({render(tree[3])})"


LEAVES = st.one_of(
    SCALARS.map(lambda v: ("const", v)),
    st.sampled_from(["a", "b", "c"]).map(lambda name: ("param", name)),
)


def _extend(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(LEAVES, max_size=3).map(lambda items: ("list", items)),
        children.map(lambda c: ("not", c)),
        st.tuples(st.sampled_from(["and", "or"]), children, children),
        st.tuples(st.just("cmp"), st.sampled_from(COMPARE), children, children),
    )


TREES = st.recursive(LEAVES, _extend, max_leaves=8)


@settings(max_examples=200, deadline=None)
@given(tree=TREES, params=PARAMS)
def test_evaluation_agrees_with_the_reference(tree: Any, params: dict[str, Any]) -> None:
    condition = parse_condition(render(tree), roots=ALL)
    try:
        expected: bool | None = bool(ref_eval(tree, params))
    except Incompatible:
        expected = None
    ctx = ExprContext(params=params, outputs={})
    if expected is None:
        with pytest.raises(ConditionInvalid):
            evaluate(condition, ctx)
    else:
        assert evaluate(condition, ctx) is expected


@settings(max_examples=100, deadline=None)
@given(value=SCALARS)
def test_a_rendered_literal_reads_back_as_itself(value: Any) -> None:
    ctx = ExprContext(params={"v": value}, outputs={})
    assert holds(f"${{{{ params.v }}}} == {render_scalar(value)}", ctx)
    if isinstance(value, float) and math.isfinite(value):
        assert holds(f"{render_scalar(value)} == {render_scalar(value)}", ctx)


TOKENS = st.sampled_from(
    [
        "${{ params.a }}",
        "${{ params.b.x }}",
        "${{ output }}",
        "${{",
        "}}",
        "'s'",
        '"t"',
        "'",
        "\\",
        "1",
        "-2.5",
        "1e5",
        "true",
        "null",
        "True",
        "and",
        "or",
        "not",
        "in",
        "==",
        "<",
        ">=",
        "!=",
        "(",
        ")",
        "[",
        "]",
        ",",
        ".",
        "__class__",
        "lambda",
        "+",
    ]
)


def _parse_and_evaluate(text: str) -> None:
    try:
        condition = parse_condition(text, roots=ALL)
    except ConditionInvalid:
        return
    ctx = ExprContext(params={"a": 1, "b": {"x": "y"}}, outputs={}, output=[1])
    with contextlib.suppress(ExpressionError):
        assert isinstance(evaluate(condition, ctx), bool)


@settings(max_examples=300, deadline=None)
@given(text=st.lists(TOKENS, max_size=30).map(" ".join))
def test_token_soup_only_raises_the_grammars_own_errors(text: str) -> None:
    _parse_and_evaluate(text)


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200))
def test_arbitrary_text_only_raises_the_grammars_own_errors(text: str) -> None:
    _parse_and_evaluate(text)


@settings(max_examples=30, deadline=None)
@given(
    opener=st.sampled_from(["(", "[", "not ", "${{ "]),
    count=st.integers(MAX_DEPTH + 1, 5000),
)
def test_deep_or_huge_input_is_refused_not_recursed_into(opener: str, count: int) -> None:
    with pytest.raises(ConditionInvalid):
        parse_condition(opener * count + "1", roots=ALL)
