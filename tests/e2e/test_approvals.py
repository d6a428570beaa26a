"""Approval gates on a real worker: a job parks at its gate holding no worker, then goes on."""

import uuid
from typing import Any

import pytest

from service.engine.approvals import list_approvals
from service.platform.db import unit_of_work
from service.platform.errors import AlreadyDecided, NotAwaitingApproval
from tests.e2e.conftest import Client, wait_for

pytestmark = pytest.mark.usefixtures("shared_worker")


def gated(**approval: Any) -> dict[str, Any]:
    """build, then ship behind a gate (reading its own decision), then announce."""
    return {
        "name": "release",
        "steps": [
            {"id": "build", "action": "drill.count", "with": {"name": "build"}},
            {
                "id": "ship",
                "action": "drill.count",
                "depends_on": ["build"],
                "approval": {"required": True, **approval},
                "with": {"name": "ship", "value": "${{ approval.ship.payload }}"},
            },
            {
                "id": "announce",
                "action": "drill.count",
                "depends_on": ["ship"],
                "with": {"name": "announce", "value": "${{ approval.ship.comment }}"},
            },
        ],
    }


def parked(client: Client, job_id: uuid.UUID) -> Any:
    return wait_for(
        lambda: (v := client.view(job_id)).job.status == "awaiting_approval" and v,
        30,
        "the job to reach its gate",
    )


def test_a_job_waits_at_its_gate_without_a_worker_then_runs_with_the_decision(
    client: Client,
) -> None:
    job_id = client.submit(gated())
    view = parked(client, job_id)

    steps = {s.step_id: (s.status, s.attempts) for s in view.steps}
    assert steps == {
        "build": ("succeeded", 1),
        "ship": ("awaiting_approval", 0),
        "announce": ("pending", 0),
    }
    assert client.count(job_id, "ship", "started") == 0
    with unit_of_work(client.rt.sessions) as session:
        waiting = [
            a.job_id
            for a, _ in list_approvals(session, statuses=["pending"], visible_to=None, limit=500)
        ]
    assert job_id in waiting

    client.broker.flushdb()
    client.decide(job_id, "ship", approve=True, payload={"version": "1.2"}, comment="ship it")
    done = client.wait_final(job_id)

    assert done.job.status == "succeeded", done.job.error
    assert done.job.result["announce"]["value"] == "ship it"
    assert client.count(job_id, "ship") == 1 and client.count(job_id, "announce") == 1
    with pytest.raises(AlreadyDecided):
        client.decide(job_id, "ship", approve=False)


def test_a_rejected_step_fails_the_job_and_nothing_after_it_runs(client: Client) -> None:
    job_id = client.submit(gated())
    parked(client, job_id)
    with pytest.raises(NotAwaitingApproval):
        client.decide(job_id, "build", approve=True)

    client.decide(job_id, "ship", approve=False, comment="not today")
    done = client.wait_final(job_id)

    steps = {s.step_id: s for s in done.steps}
    assert done.job.status == "failed"
    assert steps["ship"].status == "rejected"
    assert steps["ship"].error["message"] == "rejected by tests: not today"
    assert steps["announce"].status == "cancelled"
    assert client.count(job_id, "ship", "started") == 0
    assert client.count(job_id, "announce", "started") == 0
