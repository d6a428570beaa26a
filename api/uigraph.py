"""The job page's two pictures, laid out here and drawn as SVG by its template: the DAG with
its edges, and a timeline of every step's attempts. Both are computed on the server from the
profile and the event log, so the dashboard needs no front-end library and a browser test can
read what it shows."""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from service.engine.events import Event
from service.language.profiles import Profile
from service.language.specs import StepSpec
from service.platform.constants import DEFAULT_QUEUE

NODE_W, NODE_H, GAP_X, GAP_Y, PAD = 176, 50, 56, 16, 12
LABEL_W, PLOT_W, ROW_H, AXIS_H = 150, 760, 22, 24

SETTLED = {"succeeded", "failed", "skipped", "reused", "cached", "cancelled", "rejected"}
PARKED = {
    "awaiting_approval",
    "awaiting_signal",
    "awaiting_slot",
    "awaiting_rate",
    "awaiting_child",
    "sleeping",
}


@dataclass(frozen=True)
class Node:
    step_id: str
    status: str
    x: int
    y: int
    marks: tuple[str, ...]
    """What the step does beside running once: fans out, loops, waits for a person, a timer,
    a signal or a child job, runs on another queue."""


@dataclass(frozen=True)
class Edge:
    path: str
    back: bool
    """A loop's edge from its last step back to its first, drawn dashed."""


@dataclass(frozen=True)
class Graph:
    width: int
    height: int
    nodes: list[Node]
    edges: list[Edge]
    node_w: int = NODE_W
    node_h: int = NODE_H


def _marks(profile: Profile, step: StepSpec) -> tuple[str, ...]:
    marks = []
    if step.for_each is not None:
        marks.append("fan-out")
    loop = profile.loop_of(step.id)
    if loop is not None:
        marks.append(f"loop ≤{loop.max_rounds}")
    if step.approval is not None:
        marks.append("approval")
    if step.action == "wait":
        marks.append("timer")
    if step.wait_for is not None:
        marks.append(f"signal {step.wait_for.signal}")
    if step.action == "pipeline.run":
        marks.append("child job")
    if profile.queue_of(step.id) != DEFAULT_QUEUE:
        marks.append(f"queue {profile.queue_of(step.id)}")
    return tuple(marks)


def _curve(x1: int, y1: int, x2: int, y2: int) -> str:
    bend = max((x2 - x1) // 2, GAP_X // 2)
    return f"M{x1},{y1} C{x1 + bend},{y1} {x2 - bend},{y2} {x2},{y2}"


def _loop_back(last: Node, first: Node, bottom: int) -> str:
    """Below every node, so the edge back never crosses one."""
    x1, x2 = last.x + NODE_W // 2, first.x + NODE_W // 2
    y1, y2 = last.y + NODE_H, first.y + NODE_H
    return f"M{x1},{y1} C{x1},{bottom} {x2},{bottom} {x2},{y2}"


def dag(profile: Profile, statuses: Mapping[str, str]) -> Graph:
    """Layers left to right as the engine runs them, each step below the one before."""
    nodes: dict[str, Node] = {}
    for column, layer in enumerate(profile.layers()):
        for row, step_id in enumerate(layer):
            nodes[step_id] = Node(
                step_id,
                statuses.get(step_id, "pending"),
                PAD + column * (NODE_W + GAP_X),
                PAD + row * (NODE_H + GAP_Y),
                _marks(profile, profile.step(step_id)),
            )
    bottom = max(node.y for node in nodes.values()) + NODE_H + PAD
    edges = [
        Edge(_curve(up.x + NODE_W, up.y + NODE_H // 2, down.x, down.y + NODE_H // 2), False)
        for down in nodes.values()
        for up in (nodes[dep] for dep in profile.step(down.step_id).depends_on)
    ]
    for loop in profile.loops:
        first = next(s for s in loop.steps if not set(profile.step(s).depends_on) & set(loop.steps))
        last = nodes[profile.loop_last(loop)]
        edges.append(Edge(_loop_back(last, nodes[first], bottom + GAP_Y), True))
    width = max(node.x for node in nodes.values()) + NODE_W + PAD
    return Graph(width, bottom + (2 * GAP_Y if profile.loops else 0), list(nodes.values()), edges)


@dataclass(frozen=True)
class Bar:
    x: float
    width: float
    kind: str
    """``queue`` (ready, not yet taken), ``run``, ``retry`` (backing off before the next
    attempt) or ``parked`` (waiting for a person, a timer, a signal, a slot or a child)."""
    title: str


@dataclass(frozen=True)
class Row:
    step_id: str
    y: int
    bars: list[Bar]


@dataclass(frozen=True)
class Timeline:
    width: int
    height: int
    rows: list[Row]
    ticks: list[tuple[float, str]]


@dataclass(frozen=True)
class _Span:
    kind: str
    start: datetime
    end: datetime
    attempt: int
    round: int


def _kind(status: str) -> str | None:
    if status == "running":
        return "run"
    if status == "retrying":
        return "retry"
    if status in PARKED:
        return "parked"
    return "queue" if status == "pending" else None


def _spans(events: Sequence[Event], ready: Mapping[str, datetime], end: datetime) -> list[_Span]:
    """One step's history as spans between its state changes; a pending one counts as
    queued only from when its upstream steps had all settled."""
    spans = []
    for index, event in enumerate(events):
        kind = _kind(event.kind.removeprefix("step."))
        if kind is None:
            continue
        start = event.at
        if kind == "queue":
            start = max(start, ready.get(event.step_id or "", start))
        stop = events[index + 1].at if index + 1 < len(events) else end
        if stop > start:
            data = event.data
            spans.append(_Span(kind, start, stop, data.get("attempt", 0), data.get("round", 1)))
    return spans


def _settled_at(events: Iterable[Event]) -> dict[str, datetime]:
    last: dict[str, datetime] = {}
    for event in events:
        if event.step_id and event.kind.removeprefix("step.") in SETTLED:
            last[event.step_id] = event.at
    return last


def _ticks(total_s: float) -> list[tuple[float, str]]:
    step = next((s for s in (0.1, 0.5, 1, 5, 10, 30, 60, 300, 600, 3600) if total_s / s <= 8), 7200)
    count = int(total_s // step) + 1
    unit = "min" if step >= 60 else "s"
    scale = 60 if unit == "min" else 1
    return [
        (LABEL_W + PLOT_W * (i * step) / total_s, f"{i * step / scale:g} {unit}")
        for i in range(count)
    ]


def timeline(profile: Profile, events: Sequence[Event], start: datetime, end: datetime) -> Timeline:
    """Every step's attempts on one time axis, from the job's creation to its end (or now)."""
    total_s = max((end - start).total_seconds(), 0.001)
    settled = _settled_at(events)
    ready = {
        step.id: max([settled.get(dep, start) for dep in step.depends_on], default=start)
        for step in profile.steps
    }
    rows = []
    for index, step in enumerate(profile.steps):
        own = [e for e in events if e.step_id == step.id and e.kind != "step.progress"]
        bars = [
            Bar(
                LABEL_W + PLOT_W * (span.start - start).total_seconds() / total_s,
                max(PLOT_W * (span.end - span.start).total_seconds() / total_s, 1.0),
                span.kind,
                f"{step.id}: {span.kind} {(span.end - span.start).total_seconds():.2f} s"
                f" (attempt {span.attempt}, round {span.round})",
            )
            for span in _spans(own, ready, end)
        ]
        rows.append(Row(step.id, AXIS_H + index * ROW_H, bars))
    height = AXIS_H + len(rows) * ROW_H + PAD
    return Timeline(LABEL_W + PLOT_W + PAD, height, rows, _ticks(total_s))
