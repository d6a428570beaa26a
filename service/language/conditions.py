"""Conditions: the one boolean grammar behind a step's ``when``, a loop's ``until`` and verify
``expr`` rules, e.g. ``${{ params.mode }} == 'full' and ${{ output.total }} > 0``.

A condition is user text, so it gets its own tokenizer and parser rather than Python's: the
grammar has references, literals, comparisons and ``and``/``or``/``not`` and nothing else, so
there is no name, attribute or call for a profile to reach code through. References are parsed
by ``service.language.expressions.parse_ref``, the parser of step inputs, with the roots the caller
allows (``output`` only where a step's own output is checked).

Values are JSON's, and so are the rules: ``true`` is not ``1``; ``null``, ``false``, ``0``,
``""``, ``[]`` and ``{}`` are false; ordering compares two numbers or two strings and nothing
else. ``and``, ``or`` and ``not`` give ``true`` or ``false`` (not one of their operands) and
short-circuit. Only the lowercase ``true``, ``false`` and ``null`` are literals: ``True`` and
``None`` are refused with a hint rather than accepted, so one profile does not mix two
spellings. Comparisons do not chain (``a < b < c`` is refused; write ``a < b and b < c``).

Limits bound the work any text can cause: ``MAX_LENGTH`` characters, ``MAX_DEPTH`` levels of
parentheses, lists and ``not``, ``MAX_LIST_ITEMS`` items in a list literal.
"""

import math
import operator
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

from service.language.expressions import ExprContext, Ref, lookup, parse_ref
from service.platform.errors import ConditionInvalid, ExpressionError

MAX_LENGTH = 1000
MAX_DEPTH = 32
MAX_LIST_ITEMS = 100

_OPEN, _CLOSE = "${{", "}}"
_SPACE_RE = re.compile(r"\s+")
_NUMBER_RE = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_WORD_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPERATORS = ("==", "!=", "<=", ">=", "<", ">")
_PUNCTUATION = "()[],"
_LITERAL_WORDS: dict[str, Any] = {"true": True, "false": False, "null": None}
_OPERATOR_WORDS = frozenset({"and", "or", "not", "in"})
_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "t": "\t", "r": "\r"}
_PYTHON_SPELLINGS = {"True": "true", "False": "false", "None": "null"}

CompareOp = Literal["==", "!=", "<", "<=", ">", ">=", "in", "not in"]
_COMPARE_OPS: dict[str, CompareOp] = {op: op for op in ("==", "!=", "<", "<=", ">", ">=")}
_ORDERING: dict[str, Callable[[Any, Any], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


@dataclass(frozen=True)
class ConstNode:
    value: Any


@dataclass(frozen=True)
class RefNode:
    ref: Ref


@dataclass(frozen=True)
class ListNode:
    items: tuple["Node", ...]


@dataclass(frozen=True)
class NotNode:
    operand: "Node"


@dataclass(frozen=True)
class BoolNode:
    op: Literal["and", "or"]
    operands: tuple["Node", ...]


@dataclass(frozen=True)
class CompareNode:
    op: CompareOp
    left: "Node"
    right: "Node"


Node = ConstNode | RefNode | ListNode | NotNode | BoolNode | CompareNode


@dataclass(frozen=True)
class Condition:
    """A parsed condition; ``text`` is what the profile says, kept for messages."""

    text: str
    tree: Node

    def refs(self) -> list[Ref]:
        """Every reference in source order, repeats included, so a profile check can hold a
        condition to the rules of ``with:`` references."""
        return list(_refs(self.tree))

    def __str__(self) -> str:
        return self.text


def _refs(node: Node) -> Iterator[Ref]:
    if isinstance(node, RefNode):
        yield node.ref
    elif isinstance(node, ListNode):
        for item in node.items:
            yield from _refs(item)
    elif isinstance(node, NotNode):
        yield from _refs(node.operand)
    elif isinstance(node, BoolNode):
        for operand in node.operands:
            yield from _refs(operand)
    elif isinstance(node, CompareNode):
        yield from _refs(node.left)
        yield from _refs(node.right)


def _short(text: str) -> str:
    return text if len(text) <= 80 else text[:77] + "..."


def _invalid(text: str, reason: str, position: int | None = None) -> ConditionInvalid:
    where = f" at position {position}" if position is not None else ""
    return ConditionInvalid(
        f"invalid condition {_short(text)!r}: {reason}{where}",
        {"expression": text, "reason": reason, "position": position},
    )


@dataclass(frozen=True)
class _Token:
    kind: Literal["ref", "literal", "word", "op", "punct", "end"]
    text: str
    pos: int
    value: Any = None


def _string(text: str, pos: int) -> tuple[str, int]:
    """The string literal opening at ``pos`` and the position after its closing quote."""
    quote, i = text[pos], pos + 1
    out: list[str] = []
    while i < len(text):
        char = text[i]
        if char == quote:
            return "".join(out), i + 1
        if char == "\\":
            escaped = text[i + 1 : i + 2]
            if escaped not in _ESCAPES:
                shown = repr("\\" + escaped) if escaped else "a lone '\\'"
                raise _invalid(text, f"unknown escape {shown}; use \\\\ \\' \\\" \\n \\t or \\r", i)
            out.append(_ESCAPES[escaped])
            i += 2
        else:
            out.append(char)
            i += 1
    raise _invalid(text, "unterminated string", pos)


def _reference(text: str, pos: int, roots: frozenset[str]) -> tuple[Ref, int]:
    end = text.find(_CLOSE, pos + len(_OPEN))
    if end < 0:
        raise _invalid(text, "unterminated '${{'", pos)
    source = text[pos : end + len(_CLOSE)]
    if _OPEN in source[len(_OPEN) :]:
        raise _invalid(text, "nested '${{'", pos)
    try:
        return parse_ref(source, roots), end + len(_CLOSE)
    except ExpressionError as exc:
        raise _invalid(text, f"{source}: {exc.details['reason']}", pos) from None


def _word(text: str, word: str, pos: int) -> _Token:
    if word in _LITERAL_WORDS:
        return _Token("literal", word, pos, _LITERAL_WORDS[word])
    if word in _OPERATOR_WORDS:
        return _Token("word", word, pos)
    if word in _PYTHON_SPELLINGS:
        raise _invalid(text, f"write {_PYTHON_SPELLINGS[word]!r}, not {word!r}", pos)
    raise _invalid(
        text, f"unknown word {word!r}; references are written ${{{{ params.name }}}}", pos
    )


def _number(text: str, source: str, pos: int) -> _Token:
    is_float = any(char in source for char in ".eE")
    value = float(source) if is_float else int(source)
    if isinstance(value, float) and not math.isfinite(value):
        raise _invalid(text, f"number {source} is out of range", pos)
    return _Token("literal", source, pos, value)


def _tokens(text: str, roots: frozenset[str]) -> list[_Token]:
    tokens: list[_Token] = []
    pos = 0
    while pos < len(text):
        char = text[pos]
        if space := _SPACE_RE.match(text, pos):
            pos = space.end()
        elif text.startswith(_OPEN, pos):
            ref, end = _reference(text, pos, roots)
            tokens.append(_Token("ref", text[pos:end], pos, ref))
            pos = end
        elif char in "'\"":
            value, end = _string(text, pos)
            tokens.append(_Token("literal", text[pos:end], pos, value))
            pos = end
        elif number := _NUMBER_RE.match(text, pos):
            tokens.append(_number(text, number.group(0), pos))
            pos = number.end()
        elif word := _WORD_RE.match(text, pos):
            tokens.append(_word(text, word.group(0), pos))
            pos = word.end()
        elif op := next((op for op in _OPERATORS if text.startswith(op, pos)), None):
            tokens.append(_Token("op", op, pos))
            pos += len(op)
        elif char in _PUNCTUATION:
            tokens.append(_Token("punct", char, pos))
            pos += 1
        else:
            raise _invalid(text, f"unexpected character {char!r}", pos)
    tokens.append(_Token("end", "", len(text)))
    return tokens


class _Parser:
    """Recursive descent with Python's precedence: ``or`` < ``and`` < ``not`` < comparison.

    Each parenthesis, list and ``not`` adds a level, refused past ``MAX_DEPTH``, which also
    bounds the recursion of evaluation."""

    def __init__(self, text: str, tokens: list[_Token]) -> None:
        self.text = text
        self.tokens = tokens
        self.at = 0

    def parse(self) -> Node:
        if self._peek().kind == "end":
            raise _invalid(self.text, "empty condition")
        node = self._or(0)
        if self._peek().kind != "end":
            self._unexpected("an operator")
        return node

    def _peek(self, ahead: int = 0) -> _Token:
        return self.tokens[min(self.at + ahead, len(self.tokens) - 1)]

    def _take(self) -> _Token:
        token = self._peek()
        self.at += 1
        return token

    def _accept(self, kind: str, text: str) -> bool:
        token = self._peek()
        if token.kind == kind and token.text == text:
            self.at += 1
            return True
        return False

    def _unexpected(self, wanted: str) -> NoReturn:
        token = self._peek()
        found = "the end" if token.kind == "end" else repr(token.text)
        raise _invalid(self.text, f"expected {wanted}, found {found}", token.pos)

    def _deeper(self, depth: int) -> int:
        if depth >= MAX_DEPTH:
            reason = f"nested more than {MAX_DEPTH} levels deep"
            raise _invalid(self.text, reason, self._peek().pos)
        return depth + 1

    def _or(self, depth: int) -> Node:
        operands = [self._and(depth)]
        while self._accept("word", "or"):
            operands.append(self._and(depth))
        return operands[0] if len(operands) == 1 else BoolNode("or", tuple(operands))

    def _and(self, depth: int) -> Node:
        operands = [self._not(depth)]
        while self._accept("word", "and"):
            operands.append(self._not(depth))
        return operands[0] if len(operands) == 1 else BoolNode("and", tuple(operands))

    def _not(self, depth: int) -> Node:
        if self._accept("word", "not"):
            return NotNode(self._not(self._deeper(depth)))
        return self._comparison(depth)

    def _comparison(self, depth: int) -> Node:
        left = self._operand(depth)
        op = self._compare_op()
        if op is None:
            return left
        node = CompareNode(op, left, self._operand(depth))
        chained_at = self._peek().pos
        if self._compare_op() is not None:
            reason = "comparisons do not chain; join them with 'and'"
            raise _invalid(self.text, reason, chained_at)
        return node

    def _compare_op(self) -> CompareOp | None:
        token = self._peek()
        if token.kind == "op":
            self.at += 1
            return _COMPARE_OPS[token.text]
        if self._accept("word", "in"):
            return "in"
        if token.kind == "word" and token.text == "not" and self._peek(1).text == "in":
            self.at += 2
            return "not in"
        return None

    def _operand(self, depth: int) -> Node:
        token = self._peek()
        if token.kind == "ref":
            self.at += 1
            return RefNode(token.value)
        if token.kind == "literal":
            self.at += 1
            return ConstNode(token.value)
        if self._accept("punct", "("):
            node = self._or(self._deeper(depth))
            if not self._accept("punct", ")"):
                self._unexpected("')'")
            return node
        if self._accept("punct", "["):
            return self._list(self._deeper(depth))
        self._unexpected("a value")

    def _list(self, depth: int) -> Node:
        items: list[Node] = []
        if self._accept("punct", "]"):
            return ListNode(())
        while True:
            if len(items) == MAX_LIST_ITEMS:
                reason = f"a list holds at most {MAX_LIST_ITEMS} items"
                raise _invalid(self.text, reason, self._peek().pos)
            items.append(self._operand(depth))
            if self._accept("punct", "]"):
                return ListNode(tuple(items))
            if not self._accept("punct", ","):
                self._unexpected("',' or ']'")


def parse_condition(text: str, *, roots: frozenset[str]) -> Condition:
    """Parse ``text``, whose references may start only with one of ``roots``.

    Raises ``ConditionInvalid`` (an ``ExpressionError``) naming the problem and its position."""
    if len(text) > MAX_LENGTH:
        raise _invalid(text, f"condition is {len(text)} characters, the limit is {MAX_LENGTH}")
    return Condition(text, _Parser(text, _tokens(text, roots)).parse())


def evaluate(condition: Condition, ctx: ExprContext) -> bool:
    """Whether ``condition`` holds in ``ctx``. Raises ``ExpressionError`` when a reference does
    not resolve and ``ConditionInvalid`` when values of incompatible types meet."""
    return truthy(_value(condition, condition.tree, ctx))


def truthy(value: Any) -> bool:
    """JSON truthiness: null, false, 0, "", [] and {} are false, anything else true."""
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, int | float):
        return value != 0
    if isinstance(value, str | list | tuple | Mapping):
        return len(value) > 0
    return True


def _value(condition: Condition, node: Node, ctx: ExprContext) -> Any:
    if isinstance(node, ConstNode):
        return node.value
    if isinstance(node, RefNode):
        return lookup(node.ref, ctx)
    if isinstance(node, ListNode):
        return [_value(condition, item, ctx) for item in node.items]
    if isinstance(node, NotNode):
        return not truthy(_value(condition, node.operand, ctx))
    if isinstance(node, BoolNode):
        tests = (truthy(_value(condition, operand, ctx)) for operand in node.operands)
        return all(tests) if node.op == "and" else any(tests)
    left = _value(condition, node.left, ctx)
    right = _value(condition, node.right, ctx)
    return _compare(condition, node.op, left, right)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if _is_number(value):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "list"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def json_equal(a: Any, b: Any) -> bool:
    """Equality of JSON values: a boolean equals only a boolean, ``1`` equals ``1.0``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(json_equal(a[key], b[key]) for key in a)
    if _kind(a) != _kind(b):
        return False
    return bool(a == b)


def _compare(condition: Condition, op: CompareOp, left: Any, right: Any) -> bool:
    if op == "==":
        return json_equal(left, right)
    if op == "!=":
        return not json_equal(left, right)
    if op in ("in", "not in"):
        found = _contains(condition, right, left)
        return found if op == "in" else not found
    if (_is_number(left) and _is_number(right)) or (
        isinstance(left, str) and isinstance(right, str)
    ):
        return _ORDERING[op](left, right)
    reason = f"cannot order a {_kind(left)} and a {_kind(right)} with {op!r}"
    raise _invalid(condition.text, reason)


def _contains(condition: Condition, container: Any, member: Any) -> bool:
    if isinstance(container, list | tuple):
        return any(json_equal(member, item) for item in container)
    if isinstance(container, str | Mapping) and isinstance(member, str):
        return member in container
    reason = (
        f"'in' takes a list, or a string in a string or an object; "
        f"got a {_kind(member)} in a {_kind(container)}"
    )
    raise _invalid(condition.text, reason)
