"""The job page's pictures: the DAG with its edges and marks, and each step's time as queued,
running, backing off or parked, laid out from the profile and the event log alone."""

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from api.uigraph import LABEL_W, NODE_W, PLOT_W, dag, timeline
from service.engine.events import Event
from service.language.checks import validate_profile
from service.language.profiles import Profile

T0 = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
JOB = uuid.uuid4()


def _profile(raw: dict[str, Any]) -> Profile:
    return validate_profile(raw, source="test", known_actions={"noop", "wait"})


REVIEWED = _profile(
    {
        "name": "reviewed",
        "params": {"items": {"type": "array", "default": [1, 2]}},
        "loops": [{"steps": ["draft", "review"], "until": "${{ steps.review.output.ok }}"}],
        "steps": [
            {"id": "fetch", "action": "noop"},
            {"id": "draft", "action": "noop", "depends_on": ["fetch"]},
            {"id": "review", "action": "noop", "depends_on": ["draft"]},
            {
                "id": "each",
                "action": "noop",
                "depends_on": ["review"],
                "for_each": {"items": "${{ params.items }}"},
                "queue": "gpu",
            },
            {
                "id": "publish",
                "action": "noop",
                "depends_on": ["fetch", "each"],
                "approval": {"timeout_s": 60},
            },
        ],
    }
)


def _event(seq: int, step: str, status: str, at_s: float, attempt: int = 1) -> Event:
    data = {"attempt": attempt, "round": 1}
    return Event(JOB, seq, f"step.{status}", step, data, T0 + timedelta(seconds=at_s))


def test_every_dependency_is_an_edge_and_the_loop_goes_back_dashed() -> None:
    graph = dag(REVIEWED, {"fetch": "succeeded", "publish": "awaiting_approval"})

    nodes = {node.step_id: node for node in graph.nodes}
    assert len([e for e in graph.edges if not e.back]) == 5
    assert [e.back for e in graph.edges].count(True) == 1
    assert nodes["draft"].x == nodes["fetch"].x + NODE_W + 56, "one layer to the right"
    assert nodes["publish"].status == "awaiting_approval" and nodes["each"].status == "pending"
    assert nodes["each"].marks == ("fan-out", "queue gpu")
    assert nodes["draft"].marks == ("loop ≤3",) and nodes["publish"].marks == ("approval",)
    assert graph.width >= max(node.x for node in graph.nodes) + NODE_W


def test_a_step_is_queued_from_when_its_upstream_settled_then_runs_backs_off_and_parks() -> None:
    one = _profile(
        {
            "name": "two",
            "steps": [
                {"id": "a", "action": "noop"},
                {"id": "b", "action": "noop", "depends_on": ["a"], "approval": {"timeout_s": 9}},
            ],
        }
    )
    events = [
        _event(1, "a", "pending", 0),
        _event(2, "b", "pending", 0),
        _event(3, "a", "running", 1),
        _event(4, "a", "retrying", 2),
        _event(5, "a", "running", 4, attempt=2),
        _event(6, "a", "succeeded", 5, attempt=2),
        _event(7, "b", "running", 6),
        _event(8, "b", "awaiting_approval", 7),
        _event(9, "b", "succeeded", 10),
    ]

    picture = timeline(one, events, T0, T0 + timedelta(seconds=10))

    a, b = picture.rows
    assert [bar.kind for bar in a.bars] == ["queue", "run", "retry", "run"]
    assert [bar.kind for bar in b.bars] == ["queue", "run", "parked"]
    assert b.bars[0].x == LABEL_W + PLOT_W * 0.5, "b queues from a's success at 5 s, not 0"
    assert b.bars[2].width == PLOT_W * 0.3
    assert "attempt 2" in a.bars[3].title
    assert picture.ticks[0][1] == "0 s" and picture.ticks[-1][1] == "10 s"


def test_a_step_still_running_reaches_the_end_of_the_axis() -> None:
    only = _profile({"name": "one", "steps": [{"id": "a", "action": "noop"}]})
    events = [_event(1, "a", "pending", 0), _event(2, "a", "running", 0)]

    (row,) = timeline(only, events, T0, T0 + timedelta(seconds=3)).rows

    assert row.bars[-1].kind == "run" and row.bars[-1].x + row.bars[-1].width == LABEL_W + PLOT_W
