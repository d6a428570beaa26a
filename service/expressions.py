"""``${{ ... }}`` references in profile inputs.

Profiles come from users, so expressions are a closed grammar of lookups (params, upstream step
outputs, the current fan-out item) and never reach eval, exec or a template engine: a profile
can move data between steps but cannot run code.
"""

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal

from service.errors import ExpressionError

PathSeg = str | int
Root = Literal["params", "steps", "item"]

_IDENT = r"[A-Za-z_][A-Za-z0-9_-]*"
_OPEN = "${{"
_EXPR_RE = re.compile(r"\$\{\{(.*?)\}\}", re.DOTALL)
_SEGMENT_RE = re.compile(rf"\.(?P<name>{_IDENT})|\.(?P<dot>\d+)|\[(?P<idx>\d+)\]")
_ROOT_RE = re.compile(r"(?P<root>params|steps|item)")


class _NoItem(Enum):
    NO_ITEM = "no_item"


NO_ITEM = _NoItem.NO_ITEM
"""Marks an ``ExprContext`` outside a for_each fan-out, where ``item`` has no meaning."""


@dataclass(frozen=True)
class Ref:
    root: Root
    name: str | None
    path: tuple[PathSeg, ...] = ()

    def __str__(self) -> str:
        parts: list[str] = [self.root]
        if self.name is not None:
            parts.append("." + self.name)
        if self.root == "steps":
            parts.append(".output")
        parts.extend(f"[{seg}]" if isinstance(seg, int) else f".{seg}" for seg in self.path)
        return "${{ " + "".join(parts) + " }}"


@dataclass
class ExprContext:
    params: Mapping[str, Any]
    outputs: Mapping[str, Any]
    item: Any = field(default=NO_ITEM)


def _malformed(expression: str, reason: str) -> ExpressionError:
    return ExpressionError(
        f"malformed expression {expression!r}: {reason}",
        {"expression": expression, "reason": reason},
    )


def parse_path(text: str, expression: str = "") -> tuple[PathSeg, ...]:
    """Parse ``.a.b[0].1`` style segments; used for refs and for dotted paths like result.items."""
    segments: list[PathSeg] = []
    pos = 0
    while pos < len(text):
        match = _SEGMENT_RE.match(text, pos)
        if match is None:
            raise _malformed(expression or text, f"unexpected {text[pos:]!r}")
        if match["name"] is not None:
            segments.append(match["name"])
        else:
            segments.append(int(match["dot"] if match["dot"] is not None else match["idx"]))
        pos = match.end()
    return tuple(segments)


def _parse_expr(expression: str) -> Ref:
    body = expression[len(_OPEN) : -2].strip()
    root_match = _ROOT_RE.match(body)
    if root_match is None:
        raise _malformed(expression, "must start with params, steps or item")
    root = root_match["root"]
    segs = parse_path(body[root_match.end() :], expression)
    if root == "item":
        return Ref("item", None, segs)
    if not segs or not isinstance(segs[0], str):
        raise _malformed(expression, f"{root} needs a name, e.g. {root}.x")
    if root == "params":
        return Ref("params", segs[0], segs[1:])
    if len(segs) < 2 or segs[1] != "output":
        raise _malformed(expression, "step references take the form steps.ID.output[.path]")
    return Ref("steps", segs[0], segs[2:])


def _scan(text: str) -> Iterator[tuple[re.Match[str], Ref]]:
    pos = 0
    for match in _EXPR_RE.finditer(text):
        if _OPEN in text[pos : match.start()]:
            raise _malformed(text, "unterminated '${{'")
        inner = match.group(1)
        if _OPEN in inner:
            raise _malformed(match.group(0), "nested '${{'")
        yield match, _parse_expr(match.group(0))
        pos = match.end()
    if _OPEN in text[pos:]:
        raise _malformed(text, "unterminated '${{'")


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


def parse_refs(value: Any) -> list[Ref]:
    """All references in the strings of ``value`` (dict values and list items, recursively)."""
    return [ref for text in _strings(value) for _, ref in _scan(text)]


def whole_ref(text: str) -> Ref | None:
    """The reference if ``text`` is exactly one ``${{ }}`` (surrounding blanks ignored)."""
    stripped = text.strip()
    found = list(_scan(stripped))
    if len(found) == 1 and found[0][0].span() == (0, len(stripped)):
        return found[0][1]
    return None


def walk_path(value: Any, path: tuple[PathSeg, ...]) -> Any:
    """Follow ``path`` into JSON-like data; raises LookupError naming the segment that failed."""
    for seg in path:
        if isinstance(value, Mapping):
            key = str(seg)
            if key not in value:
                raise LookupError(f"no key {key!r}")
            value = value[key]
        elif isinstance(value, list | tuple) and isinstance(seg, int):
            if seg >= len(value):
                raise LookupError(f"index {seg} out of range (length {len(value)})")
            value = value[seg]
        else:
            raise LookupError(f"cannot take {seg!r} of a {type(value).__name__}")
    return value


def _lookup(ref: Ref, ctx: ExprContext) -> Any:
    expression = str(ref)
    name = ref.name or ""

    def fail(reason: str) -> ExpressionError:
        return ExpressionError(
            f"cannot resolve {expression}: {reason}", {"expression": expression, "reason": reason}
        )

    if ref.root == "item":
        if ctx.item is NO_ITEM:
            raise fail("'item' is only defined inside a for_each step")
        base = ctx.item
    elif ref.root == "params":
        if name not in ctx.params:
            raise fail(f"no param {name!r}")
        base = ctx.params[name]
    else:
        if name not in ctx.outputs:
            raise fail(f"no output for step {name!r}")
        base = ctx.outputs[name]
    try:
        return walk_path(base, ref.path)
    except LookupError as exc:
        raise fail(str(exc)) from None


def _render(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))


def _resolve_str(text: str, ctx: ExprContext) -> Any:
    found = list(_scan(text))
    if not found:
        return text
    stripped = text.strip()
    if len(found) == 1 and found[0][0].group(0) == stripped:
        return _lookup(found[0][1], ctx)
    out: list[str] = []
    pos = 0
    for match, ref in found:
        out.append(text[pos : match.start()])
        out.append(_render(_lookup(ref, ctx)))
        pos = match.end()
    out.append(text[pos:])
    return "".join(out)


def resolve(value: Any, ctx: ExprContext) -> Any:
    """Return ``value`` with every reference replaced; containers are copied, never mutated."""
    if isinstance(value, str):
        return _resolve_str(value, ctx)
    if isinstance(value, Mapping):
        return {key: resolve(item, ctx) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [resolve(item, ctx) for item in value]
    return value
