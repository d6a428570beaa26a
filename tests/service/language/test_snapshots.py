"""Which child a step's worker may run next in the same message (``StepFacts.follows``)."""

from typing import Any

import pytest

from service.language.checks import validate_profile
from service.language.snapshots import step_facts

ACTIONS = frozenset({"noop"})


def _profile(children: list[dict[str, Any]]) -> Any:
    steps = [{"id": "up", "action": "noop"}, {"id": "other", "action": "noop"}]
    for child in children:
        steps.append({"action": "noop", **child})
    data = {
        "name": "follows",
        "on": {"succeeded": ["upstream"]},
        "params": {
            "go": {"type": "boolean", "default": True},
            "items": {"type": "array", "default": []},
        },
        "steps": steps,
    }
    return validate_profile(data, source="test", known_actions=ACTIONS)


@pytest.mark.parametrize(
    ("children", "follows"),
    [
        ([{"id": "next", "depends_on": ["up"]}], "next"),
        ([{"id": "a", "depends_on": ["up"]}, {"id": "b", "depends_on": ["up"]}], "a"),
        ([{"id": "join", "depends_on": ["up", "other"]}], None),
        (
            [
                {"id": "join", "depends_on": ["up", "other"]},
                {"id": "later", "depends_on": ["up"]},
            ],
            "later",
        ),
        ([{"id": "gate", "depends_on": ["up"], "approval": {}}], None),
        ([{"id": "maybe", "depends_on": ["up"], "when": "${{ params.go }} == true"}], None),
        (
            [{"id": "each", "depends_on": ["up"], "for_each": {"items": "${{ params.items }}"}}],
            None,
        ),
        ([{"id": "upstream", "depends_on": ["up"], "with": {"j": "${{ trigger.job_id }}"}}], None),
        ([{"id": "reads", "depends_on": ["up"], "with": {"x": "${{ steps.up.output }}"}}], "reads"),
        ([{"id": "gpu", "depends_on": ["up"], "queue": "gpu"}], None),
        (
            [
                {"id": "gpu", "depends_on": ["up"], "queue": "gpu"},
                {"id": "here", "depends_on": ["up"], "queue": "default"},
            ],
            "here",
        ),
        ([], None),
    ],
)
def test_a_step_is_followed_by_its_first_plain_child_it_alone_precedes(
    children: list[dict[str, Any]], follows: str | None
) -> None:
    profile = _profile(children)

    assert step_facts(profile, "up").follows == follows
