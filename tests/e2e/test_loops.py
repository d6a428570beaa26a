"""Loops on a real worker: rounds until the condition holds, each round kept, capped."""

import pytest

from tests.e2e.conftest import Client, wait_for

pytestmark = pytest.mark.usefixtures("shared_worker")


def test_a_loop_goes_round_until_its_condition_holds_and_keeps_every_round(
    client: Client,
) -> None:
    job_id = client.submit("review", approve_at=3)
    view = client.wait_final(job_id)

    assert view.job.status == "succeeded", view.job.error
    assert view.job.result["publish"]["value"] == {"round": 3, "remarks": "round 2 needs work"}
    steps = {s.step_id: s for s in view.steps}
    assert (steps["draft"].round, steps["review"].round, steps["publish"].round) == (3, 3, 1)
    assert [(r.round, r.status) for r in steps["review"].rounds] == [
        (1, "succeeded"),
        (2, "succeeded"),
    ]
    runs = {name: client.count(job_id, name, "started") for name in steps}
    assert runs == {"brief": 1, "draft": 3, "review": 3, "publish": 1}


@pytest.mark.parametrize(
    ("on_exhausted", "status"), [("fail", "failed"), ("continue", "succeeded")]
)
def test_a_loop_that_runs_out_of_rounds_fails_or_goes_on(
    client: Client, on_exhausted: str, status: str
) -> None:
    profile = {
        "name": "stubborn",
        "loops": [
            {
                "steps": ["try"],
                "until": "${{ steps.try.output.approved }}",
                "max_rounds": 2,
                "on_exhausted": on_exhausted,
            }
        ],
        "steps": [
            {
                "id": "try",
                "action": "drill.review",
                "with": {"name": "try", "round": "${{ loop.round }}", "approve_at": 9},
            },
            {
                "id": "after",
                "action": "drill.count",
                "depends_on": ["try"],
                "with": {"name": "after"},
            },
        ],
    }
    job_id = client.submit(profile)
    view = client.wait_final(job_id)

    assert view.job.status == status
    assert client.count(job_id, "try", "started") == 2
    assert client.count(job_id, "after", "started") == (1 if on_exhausted == "continue" else 0)
    if on_exhausted == "fail":
        assert view.job.error["code"] == "loop_exhausted"


@pytest.mark.parametrize(("approve", "status"), [(True, "succeeded"), (False, "failed")])
def test_a_loop_that_escalates_waits_for_a_person_to_end_it(
    client: Client, approve: bool, status: str
) -> None:
    profile = {
        "name": "escalating",
        "loops": [
            {
                "steps": ["try"],
                "until": "${{ steps.try.output.approved }}",
                "max_rounds": 2,
                "on_exhausted": "escalate",
            }
        ],
        "steps": [
            {
                "id": "try",
                "action": "drill.review",
                "with": {"name": "try", "round": "${{ loop.round }}", "approve_at": 9},
            },
            {
                "id": "after",
                "action": "drill.count",
                "depends_on": ["try"],
                "with": {"name": "after"},
            },
        ],
    }
    job_id = client.submit(profile)
    wait_for(lambda: client.view(job_id).job.status == "awaiting_approval", 30, "the escalation")
    assert client.steps(job_id)["try"].status == "awaiting_approval"

    client.decide(job_id, "try", approve=approve)
    view = client.wait_final(job_id)

    assert view.job.status == status
    assert client.count(job_id, "try", "started") == 2
    assert client.count(job_id, "after", "started") == (1 if approve else 0)
