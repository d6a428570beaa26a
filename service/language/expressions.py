"""``${{ ... }}`` references in profile inputs.

Profiles come from users, so expressions are a closed grammar of lookups (params, upstream step
outputs, the current fan-out item, the names of operator secrets) and never reach eval, exec or
a template engine: a profile can move data between steps but cannot run code.
``service.language.conditions`` builds its operands with ``parse_ref``, so a reference means the
same in a condition as in a step input.
"""

import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal

from service.platform.errors import ExpressionError

PathSeg = str | int
Root = Literal[
    "params",
    "steps",
    "item",
    "output",
    "approval",
    "loop",
    "payload",
    "trigger",
    "schedule",
    "signals",
    "secrets",
]

_IDENT = r"[A-Za-z_][A-Za-z0-9_-]*"
_OPEN = "${{"
_EXPR_RE = re.compile(r"\$\{\{(.*?)\}\}", re.DOTALL)
_SEGMENT_RE = re.compile(rf"\.(?P<name>{_IDENT})|\.(?P<dot>\d+)|\[(?P<idx>\d+)\]")
_ROOT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ROOTS: dict[str, Root] = {
    "params": "params",
    "steps": "steps",
    "item": "item",
    "output": "output",
    "approval": "approval",
    "loop": "loop",
    "payload": "payload",
    "trigger": "trigger",
    "schedule": "schedule",
    "signals": "signals",
    "secrets": "secrets",
}

SECRET_NAME = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)*")
"""Fits an environment variable's name, and has no ``__``: that parts an owner from a name in
``FLOWBEAT_SECRET_<OWNER>__<NAME>``."""
_SECRET_MARK = re.compile(r"@@flowbeat-secret:(?P<nonce>[0-9a-f]{32}):(?P<name>[A-Za-z0-9_]+)@@")

INPUT_ROOTS = frozenset(
    {"params", "steps", "item", "approval", "loop", "trigger", "schedule", "signals", "secrets"}
)
TRIGGER_NAMES = frozenset({"job_id", "result", "new_items"})
SCHEDULE_NAMES = frozenset({"fire_time", "previous_fire_time"})
LOOP_NAMES = frozenset({"round", "previous"})
"""What a step's inputs may reference; ``output`` exists only where a caller allows it."""


class _Unset(Enum):
    NO_ITEM = "no_item"
    NO_OUTPUT = "no_output"
    NO_PAYLOAD = "no_payload"


NO_ITEM = _Unset.NO_ITEM
"""Marks an ``ExprContext`` outside a for_each fan-out, where ``item`` has no meaning."""

NO_OUTPUT = _Unset.NO_OUTPUT
"""Marks an ``ExprContext`` with no step output under check, where ``output`` has no meaning."""

NO_PAYLOAD = _Unset.NO_PAYLOAD
"""Marks an ``ExprContext`` outside a webhook delivery, where ``payload`` has no meaning."""

HOOK_ROOTS = frozenset({"payload"})
CONCURRENCY_ROOTS = frozenset({"params"})
"""A concurrency key is known when the job is submitted: from its params alone."""
"""What a webhook's mapping from a delivery to params may reference."""


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
    output: Any = field(default=NO_OUTPUT)
    absent: frozenset[str] = frozenset()
    """Upstream steps that did not succeed, read as ``null`` at any path (``needs: any``)."""
    decisions: Mapping[str, Any] = field(default_factory=dict)
    """The decision on each gated step: ``{status, payload, comment, decided_by}``."""
    loop: Mapping[str, Any] = field(default_factory=dict)
    """Inside a loop: ``{"round": n, "previous": {step: output of round n - 1}}``."""
    payload: Any = field(default=NO_PAYLOAD)
    """A webhook delivery's JSON body, for the hook's mapping to params."""
    trigger: Mapping[str, Any] = field(default_factory=dict)
    """In a job another job's success started: ``{"job_id": …, "result": …}`` of that job."""
    schedule: Mapping[str, Any] = field(default_factory=dict)
    """In a job a schedule, its catch-up or a backfill started: ``{"fire_time": …,
    "previous_fire_time": …}``, the nominal fire time (ISO 8601, UTC) it runs for, whenever it
    actually started, and the schedule's fire before it: the period the job covers."""
    signals: Mapping[str, Any] = field(default_factory=dict)
    """Each signal the step reads: ``{payload, received_at}``, or ``None`` when its wait timed
    out and went on (``on_timeout: continue``), read as ``null`` at any path."""
    secret: Callable[[str], str] | None = None
    """What ``secrets.<name>`` reads as: a mark for the worker to put the value in place of at
    the moment it calls the action (``reveal``); ``None`` where secrets are not read."""


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


def _names(roots: frozenset[str]) -> str:
    ordered = sorted(roots)
    return ", ".join(ordered[:-1]) + " or " + ordered[-1] if len(ordered) > 1 else ordered[0]


def parse_ref(expression: str, roots: frozenset[str] = INPUT_ROOTS) -> Ref:
    """Parse one whole ``${{ ... }}``; a root outside ``roots`` is malformed here, since what a
    reference may name depends on where it is written."""
    body = expression[len(_OPEN) : -2].strip()
    root_match = _ROOT_RE.match(body)
    root = _ROOTS.get(root_match.group(0)) if root_match is not None else None
    if root_match is None or root is None or root not in roots:
        raise _malformed(expression, f"must start with {_names(roots)}")
    segs = parse_path(body[root_match.end() :], expression)
    if root in ("item", "output", "payload"):
        return Ref(root, None, segs)
    if not segs or not isinstance(segs[0], str):
        raise _malformed(expression, f"{root} needs a name, e.g. {root}.x")
    if root in ("params", "approval", "signals"):
        return Ref(root, segs[0], segs[1:])
    if root == "secrets":
        if len(segs) != 1 or not SECRET_NAME.fullmatch(segs[0]) or len(segs[0]) > 128:
            raise _malformed(
                expression,
                "secret references are secrets.NAME: letters, digits and single underscores",
            )
        return Ref("secrets", segs[0])
    if root == "loop":
        return _loop_ref(expression, segs)
    if root == "trigger":
        if segs[0] not in TRIGGER_NAMES:
            raise _malformed(
                expression,
                "trigger references are trigger.job_id, trigger.result or trigger.new_items",
            )
        return Ref("trigger", segs[0], segs[1:])
    if root == "schedule":
        if len(segs) != 1 or segs[0] not in SCHEDULE_NAMES:
            raise _malformed(
                expression,
                "schedule references are schedule.fire_time or schedule.previous_fire_time",
            )
        return Ref("schedule", segs[0])
    if len(segs) < 2 or segs[1] != "output":
        raise _malformed(expression, "step references take the form steps.ID.output[.path]")
    return Ref("steps", segs[0], segs[2:])


def _loop_ref(expression: str, segs: tuple[PathSeg, ...]) -> Ref:
    """``loop.round``, or ``loop.previous.<step>.output[.path]``: a step's output in the round
    before this one (``null`` in the first round)."""
    if segs[0] == "round" and len(segs) == 1:
        return Ref("loop", "round")
    if segs[0] == "previous" and len(segs) >= 3 and segs[2] == "output":
        return Ref("loop", "previous", segs[1:])
    raise _malformed(expression, "loop references are loop.round or loop.previous.ID.output[.path]")


def _scan(text: str, roots: frozenset[str] = INPUT_ROOTS) -> Iterator[tuple[re.Match[str], Ref]]:
    pos = 0
    for match in _EXPR_RE.finditer(text):
        if _OPEN in text[pos : match.start()]:
            raise _malformed(text, "unterminated '${{'")
        inner = match.group(1)
        if _OPEN in inner:
            raise _malformed(match.group(0), "nested '${{'")
        yield match, parse_ref(match.group(0), roots)
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


def parse_refs(value: Any, roots: frozenset[str] = INPUT_ROOTS) -> list[Ref]:
    """All references in the strings of ``value`` (dict values and list items, recursively)."""
    return [ref for text in _strings(value) for _, ref in _scan(text, roots)]


def split_refs(text: str, roots: frozenset[str] = INPUT_ROOTS) -> list[str | Ref]:
    """``text`` as its literal pieces and its references, in order."""
    parts: list[str | Ref] = []
    pos = 0
    for match, ref in _scan(text, roots):
        parts += [text[pos : match.start()], ref]
        pos = match.end()
    return [*parts, text[pos:]]


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


def lookup(ref: Ref, ctx: ExprContext) -> Any:
    """The value ``ref`` names in ``ctx``; raises ``ExpressionError`` saying why it has none."""
    expression = str(ref)
    name = ref.name or ""

    def fail(reason: str) -> ExpressionError:
        return ExpressionError(
            f"cannot resolve {expression}: {reason}", {"expression": expression, "reason": reason}
        )

    if ref.root in ("schedule", "secrets"):
        return _named(ref, ctx, fail)
    if ref.root == "item":
        if ctx.item is NO_ITEM:
            raise fail("'item' is only defined inside a for_each step")
        base = ctx.item
    elif ref.root == "output":
        if ctx.output is NO_OUTPUT:
            raise fail("'output' is only defined where a step's output is checked")
        base = ctx.output
    elif ref.root == "trigger":
        if not ctx.trigger:
            raise fail("'trigger' is only defined in a job started by another job's success")
        base = ctx.trigger[name]
    elif ref.root == "payload":
        if ctx.payload is NO_PAYLOAD:
            raise fail("'payload' is only defined in a webhook's mapping")
        base = ctx.payload
    elif ref.root == "params":
        if name not in ctx.params:
            raise fail(f"no param {name!r}")
        base = ctx.params[name]
    elif ref.root == "loop":
        if not ctx.loop:
            raise fail("'loop' is only defined inside a loop")
        if name == "round":
            return ctx.loop["round"]
        step, *rest = ref.path
        if step not in ctx.loop["previous"]:
            return None
        base = {"output": ctx.loop["previous"][step]}
        try:
            return walk_path(base, tuple(rest))
        except LookupError as exc:
            raise fail(str(exc)) from None
    elif ref.root == "signals":
        return _signal(ref, ctx, fail)
    elif ref.root == "approval":
        if name not in ctx.decisions:
            raise fail(f"no decision on step {name!r}")
        base = ctx.decisions[name]
    elif name in ctx.absent:
        return None
    else:
        if name not in ctx.outputs:
            raise fail(f"no output for step {name!r}")
        base = ctx.outputs[name]
    try:
        return walk_path(base, ref.path)
    except LookupError as exc:
        raise fail(str(exc)) from None


def _named(ref: Ref, ctx: ExprContext, fail: Callable[[str], ExpressionError]) -> Any:
    """A reference that is a name and no path: a secret, or what the schedule knows."""
    name = ref.name or ""
    if ref.root == "schedule":
        if not ctx.schedule:
            raise fail("'schedule' is only defined in a job a schedule or a backfill started")
        if name not in ctx.schedule:
            raise fail("the job's schedule is gone, and with it its fire times")
        return ctx.schedule[name]
    if ctx.secret is None:
        raise fail("secrets are only read in a step's 'with'")
    return ctx.secret(name)


def _signal(ref: Ref, ctx: ExprContext, fail: Callable[[str], ExpressionError]) -> Any:
    """A signal whose wait timed out reads ``null`` at any path, as an absent upstream does."""
    name = ref.name or ""
    if name not in ctx.signals:
        raise fail(f"no signal {name!r} received")
    if ctx.signals[name] is None:
        return None
    try:
        return walk_path(ctx.signals[name], ref.path)
    except LookupError as exc:
        raise fail(str(exc)) from None


def _render(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))


def _resolve_str(text: str, ctx: ExprContext, roots: frozenset[str]) -> Any:
    found = list(_scan(text, roots))
    if not found:
        return text
    stripped = text.strip()
    if len(found) == 1 and found[0][0].group(0) == stripped:
        return lookup(found[0][1], ctx)
    out: list[str] = []
    pos = 0
    for match, ref in found:
        out.append(text[pos : match.start()])
        out.append(_render(lookup(ref, ctx)))
        pos = match.end()
    out.append(text[pos:])
    return "".join(out)


def resolve(value: Any, ctx: ExprContext, roots: frozenset[str] = INPUT_ROOTS) -> Any:
    """Return ``value`` with every reference replaced; containers are copied, never mutated."""
    if isinstance(value, str):
        return _resolve_str(value, ctx, roots)
    if isinstance(value, Mapping):
        return {key: resolve(item, ctx, roots) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [resolve(item, ctx, roots) for item in value]
    return value


def secret_mark(nonce: str, name: str) -> str:
    """What a secret reference resolves to until the action is called: its name and a nonce
    drawn for this one attempt, so a param or an upstream output that holds text of the same
    shape is never taken for it."""
    return f"@@flowbeat-secret:{nonce}:{name}@@"


def reveal(value: Any, nonce: str, value_of: Callable[[str], str]) -> Any:
    """``value`` with this attempt's secret marks replaced by ``value_of(name)``; containers
    are copied, as ``resolve`` copies them."""
    if isinstance(value, str):
        if "@@flowbeat-secret:" not in value:
            return value
        return _SECRET_MARK.sub(
            lambda m: value_of(m["name"]) if m["nonce"] == nonce else m.group(0), value
        )
    if isinstance(value, Mapping):
        return {key: reveal(item, nonce, value_of) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [reveal(item, nonce, value_of) for item in value]
    return value
