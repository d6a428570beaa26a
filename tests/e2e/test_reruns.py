"""Rerun from a step: upstream checkpoints are reused, never recomputed; the rest runs again."""

import uuid

import pytest

from service.engine.reruns import RerunRequest
from tests.e2e.conftest import Client

pytestmark = pytest.mark.usefixtures("shared_worker")

ITEMS = [1, 2, 3, 4]


def _ran(client: Client, job_id: uuid.UUID, names: list[str]) -> dict[str, int]:
    return {name: client.count(job_id, name, "started") for name in names}


def test_a_failed_job_reruns_from_its_failed_step_and_reuses_what_came_before(
    client: Client,
) -> None:
    parent = client.submit("rerun", bad=[3])
    assert client.wait_final(parent).job.status == "failed"

    child = client.rerun(parent, RerunRequest(from_step="each", params={"bad": []}))
    view = client.wait_final(child)

    assert view.job.status == "succeeded", view.job.error
    assert (view.job.trigger, view.job.parent_job_id) == ("rerun", parent)
    assert view.job.params == {"bad": []}
    statuses = {s.step_id: s.status for s in view.steps}
    assert statuses == {"load": "reused", "each": "succeeded", "total": "succeeded"}
    assert _ran(client, child, ["load", "each-1", "each-4", "total"]) == {
        "load": 0,
        "each-1": 1,
        "each-4": 1,
        "total": 1,
    }
    assert client.checkpoints(child, "load") == 1
    assert view.job.result["total"]["value"] == [{"name": f"each-{n}", "value": n} for n in ITEMS]


def test_only_the_failed_items_of_a_fan_out_run_again(client: Client) -> None:
    parent = client.submit("rerun", bad=[3])
    client.wait_final(parent)
    before = _ran(client, parent, ["each-1", "each-2", "each-3"])

    child = client.rerun(
        parent, RerunRequest(from_step="each", params={"bad": []}, only_failed_items=True)
    )
    view = client.wait_final(child)

    assert view.job.status == "succeeded", view.job.error
    assert before == {"each-1": 1, "each-2": 1, "each-3": 1}
    assert _ran(client, child, ["each-1", "each-2", "each-3", "each-4"]) == {
        "each-1": 0,
        "each-2": 0,
        "each-3": 1,
        "each-4": 1,
    }
    assert [s.shards for s in view.steps if s.step_id == "each"] == [
        {"total": 4, "reused": 2, "succeeded": 2}
    ]
    assert view.job.result["total"]["value"] == [{"name": f"each-{n}", "value": n} for n in ITEMS]


def test_a_succeeded_job_reruns_its_last_step_alone(client: Client) -> None:
    parent = client.submit("rerun")
    assert client.wait_final(parent).job.status == "succeeded"

    child = client.rerun(parent, RerunRequest(from_step="total"))
    view = client.wait_final(child)

    assert [s.status for s in view.steps] == ["reused", "reused", "succeeded"]
    assert _ran(client, child, ["load", "each-1", "total"]) == {"load": 0, "each-1": 0, "total": 1}
    assert view.job.result == client.view(parent).job.result


def test_without_reuse_every_step_runs_again(client: Client) -> None:
    parent = client.submit("rerun")
    client.wait_final(parent)

    child = client.rerun(parent, RerunRequest(from_step="total", reuse_upstream=False))
    view = client.wait_final(child)

    assert [s.status for s in view.steps] == ["succeeded"] * 3
    assert _ran(client, child, ["load", "each-2", "total"]) == {"load": 1, "each-2": 1, "total": 1}
