"""Sub-pipelines on real processes: a parent waiting for its child holds no worker slot (the
child runs on the one slot there is), reads the child's result, fails with it, cancels it, goes
on without it when told not to wait, stops at the depth cap, survives a worker SIGKILL while it
waits, retries a failed child only after the step's backoff, holding no slot meanwhile; the live
API and the CLI link parent and children; and a save through the live API that closes a circle
of calls is refused."""

import json
import subprocess
import sys
import uuid
from typing import Any

import httpx
import pytest

from service.catalogue.saving import save_pipeline
from service.platform.auth import create_api_key
from service.platform.db import unit_of_work
from tests.e2e.conftest import Client, Cluster, wait_for

OWNER = "tests"


def save(client: Client, profile: dict[str, Any]) -> None:
    with unit_of_work(client.rt.sessions) as session:
        save_pipeline(
            session,
            owner=OWNER,
            name=None,
            body=profile,
            settings=client.settings,
            known_actions=client.rt.registry.names(),
        )


def kid(client: Client, *, hold_s: float = 0.5, fails: bool = False) -> str:
    """A saved child pipeline of a name of its own; it counts ``kid`` and holds for ``hold_s``."""
    name = f"kid-{uuid.uuid4().hex[:8]}"
    work: dict[str, Any] = {
        "id": "work",
        "action": "drill.count",
        "with": {"name": "kid", "value": "${{ params.x }}", "hold_s": hold_s},
    }
    if fails:
        work = {
            "id": "work",
            "action": "drill.fail_on",
            "with": {"name": "kid", "value": "${{ params.x }}", "bad": [13]},
        }
    save(client, {"name": name, "params": {"x": {"type": "integer"}}, "steps": [work]})
    return name


def parent(call: dict[str, Any], name: str = "parent") -> dict[str, Any]:
    return {
        "name": name,
        "steps": [
            {"id": "first", "action": "drill.count", "with": {"name": "first"}},
            {"id": "call", "action": "pipeline.run", "depends_on": ["first"], "with": call},
            {
                "id": "after",
                "action": "drill.count",
                "depends_on": ["call"],
                "with": {"name": "after", "value": "${{ steps.call.output }}"},
            },
        ],
    }


def child_of(client: Client, job_id: uuid.UUID) -> uuid.UUID:
    """The child the job's call started, once the beat leader started it."""
    from service.platform.models import ChildCallRow

    def started() -> uuid.UUID | None:
        with unit_of_work(client.rt.sessions) as session:
            calls = session.query(ChildCallRow).filter(ChildCallRow.job_id == job_id).all()
            return next((c.child_job_id for c in calls if c.child_job_id), None)

    found: uuid.UUID = wait_for(started, 20, "the child to start")
    return found


@pytest.mark.drill
@pytest.mark.timeout(90)
def test_a_waiting_parent_holds_no_slot_and_reads_its_childs_result_through_a_worker_kill(
    client: Client, cluster: Cluster
) -> None:
    worker = cluster.worker(concurrency=1)
    cluster.beat()
    job_id = client.submit(parent({"pipeline": kid(client, hold_s=2), "params": {"x": 21}}))
    child = child_of(client, job_id)
    wait_for(lambda: client.steps(child)["work"].status == "running", 20, "the child to run")
    assert client.steps(job_id)["call"].status == "awaiting_child"

    worker.kill_whole()
    cluster.worker(concurrency=1)

    done = client.wait_final(job_id, timeout_s=40)
    assert done.job.status == "succeeded", done.job.error
    ended = client.view(child).job
    assert (ended.status, ended.trigger, ended.owner) == ("succeeded", "parent", OWNER)
    assert done.job.result["after"]["value"] == ended.result
    assert ended.result["work"]["value"] == 21
    assert client.count(job_id, "first") == 1 and client.count(job_id, "after") == 1
    assert client.checkpoints(job_id, "call") == 1


@pytest.mark.timeout(60)
def test_a_failing_child_fails_the_parents_step(client: Client, cluster: Cluster) -> None:
    cluster.worker(concurrency=1)
    cluster.beat()
    job_id = client.submit(parent({"pipeline": kid(client, fails=True), "params": {"x": 13}}))

    done = client.wait_final(job_id, timeout_s=40)

    assert done.job.status == "failed"
    call = client.steps(job_id)["call"]
    assert call.status == "failed"
    assert call.error["details"]["child_job_id"] == str(child_of(client, job_id))
    assert client.view(child_of(client, job_id)).job.status == "failed"
    assert client.steps(job_id)["after"].status == "cancelled"


@pytest.mark.timeout(60)
def test_cancelling_the_parent_cancels_its_running_child(client: Client, cluster: Cluster) -> None:
    cluster.worker(concurrency=1)
    cluster.beat()
    job_id = client.submit(parent({"pipeline": kid(client, hold_s=30), "params": {"x": 1}}))
    child = child_of(client, job_id)
    wait_for(lambda: client.steps(child)["work"].status == "running", 20, "the child to run")

    client.cancel(job_id)

    ended = client.wait_final(child, timeout_s=15).job
    assert ended.status == "cancelled"
    assert ended.error["code"] == "parent_ended"
    assert client.view(job_id).job.status == "cancelled"


@pytest.mark.timeout(60)
def test_a_call_that_does_not_wait_goes_on_with_the_childs_id(
    client: Client, cluster: Cluster
) -> None:
    cluster.worker(concurrency=2)
    cluster.beat()
    name = kid(client, hold_s=3)
    job_id = client.submit(parent({"pipeline": name, "params": {"x": 2}, "wait": False}))

    done = client.wait_final(job_id, timeout_s=30)

    assert done.job.status == "succeeded", done.job.error
    child = uuid.UUID(done.job.result["after"]["value"]["job_id"])
    assert client.view(child).job.status in {"queued", "running"}, "the parent did not wait"
    assert client.wait_final(child, timeout_s=30).job.status == "succeeded"


@pytest.mark.timeout(60)
def test_a_child_past_the_depth_cap_fails_with_its_code(client: Client, cluster: Cluster) -> None:
    cluster.worker(concurrency=1)
    cluster.beat(max_pipeline_depth="1")
    mid = f"mid-{uuid.uuid4().hex[:8]}"
    save(client, parent({"pipeline": kid(client), "params": {"x": 1}}, name=mid))
    job_id = client.submit(parent({"pipeline": mid}))

    done = client.wait_final(job_id, timeout_s=40)

    assert done.job.status == "failed"
    middle = client.view(child_of(client, job_id))
    assert middle.job.status == "failed"
    error = {s.step_id: s for s in middle.steps}["call"].error
    assert error["code"] == "pipeline_depth_exceeded"
    assert client.steps(job_id)["call"].error["code"] == "pipeline_depth_exceeded"


@pytest.mark.timeout(60)
def test_a_save_that_would_start_itself_is_refused_by_the_api(
    client: Client, cluster: Cluster
) -> None:
    base = cluster.api()
    owner = f"e2e-calls-{uuid.uuid4().hex[:6]}"
    with unit_of_work(client.rt.sessions) as session:
        key, _ = create_api_key(session, owner=owner, scopes=("write",))
    headers = {"Authorization": f"Bearer {key}"}
    first = httpx.put(
        f"{base}/v1/pipelines/a", json=parent({"pipeline": "b"}, name="a"), headers=headers
    )
    assert first.status_code in {200, 201}, first.text

    refused = httpx.put(
        f"{base}/v1/pipelines/b", json=parent({"pipeline": "a"}, name="b"), headers=headers
    )

    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["code"] == "pipeline_cycle"
    assert error["details"]["cycle"] == ["b", "a", "b"]
    missing = httpx.get(f"{base}/v1/pipelines/b", headers=headers)
    assert missing.status_code == 404, "nothing stored half-way"


def retried(client: Client, name: str, backoff_s: float) -> uuid.UUID:
    """A parent whose call of a failing child may run twice, ``backoff_s`` apart."""
    profile = parent({"pipeline": name, "params": {"x": 13}})
    profile["steps"][1]["retry"] = {"attempts": 2, "backoff_s": backoff_s, "jitter": 0}
    return client.submit(profile)


def calls(client: Client, job_id: uuid.UUID) -> list[uuid.UUID]:
    from service.platform.models import ChildCallRow

    with unit_of_work(client.rt.sessions) as session:
        rows = session.query(ChildCallRow).filter(ChildCallRow.job_id == job_id)
        return [c.child_job_id for c in rows.order_by(ChildCallRow.attempt) if c.child_job_id]


@pytest.mark.timeout(90)
def test_a_retried_child_starts_after_the_steps_backoff_holding_no_slot(
    client: Client, cluster: Cluster
) -> None:
    cluster.worker(concurrency=1)
    cluster.beat()
    job_id = retried(client, kid(client, fails=True), backoff_s=8)
    first = child_of(client, job_id)
    ended = client.wait_final(first, timeout_s=30).job
    wait_for(lambda: client.steps(job_id)["call"].status == "retrying", 20, "the step to retry")
    backing_off = client.steps(job_id)["call"]
    assert backing_off.wake_at is not None and backing_off.wake_at >= ended.finished_at

    alone = {"id": "only", "action": "drill.count", "with": {"name": "other"}}
    other = client.submit({"name": "other", "steps": [alone]})
    assert client.wait_final(other, timeout_s=30).job.status == "succeeded"
    assert len(calls(client, job_id)) == 1, "another job ran on the one slot meanwhile"

    done = client.wait_final(job_id, timeout_s=40)
    assert done.job.status == "failed"
    second = client.view(calls(client, job_id)[1]).job
    waited = (second.created_at - ended.finished_at).total_seconds()
    assert waited >= 8, f"the second child started {waited:.2f} s after the first ended"
    assert client.steps(job_id)["call"].attempts == 2


@pytest.mark.timeout(90)
def test_the_api_and_the_cli_link_a_parent_and_its_children(
    client: Client, cluster: Cluster
) -> None:
    cluster.worker(concurrency=1)
    cluster.beat()
    base = cluster.api()
    with unit_of_work(client.rt.sessions) as session:
        key, _ = create_api_key(session, owner=OWNER, scopes=("read",))
    api = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=10)
    job_id = retried(client, kid(client, fails=True), backoff_s=0)
    assert client.wait_final(job_id, timeout_s=40).job.status == "failed"
    first, second = calls(client, job_id)

    job = api.get(f"/v1/jobs/{job_id}").json()["job"]
    child = api.get(f"/v1/jobs/{second}").json()["job"]
    listed = api.get("/v1/jobs", params={"parent": str(job_id)}).json()["jobs"]

    assert [(c["id"], c["step_id"], c["attempt"], c["status"]) for c in job["children"]] == [
        (str(first), "call", 1, "failed"),
        (str(second), "call", 2, "failed"),
    ]
    assert job["parent"] is None
    assert child["parent"] == {"job_id": str(job_id), "relation": "child", "step_id": "call"}
    assert (child["trigger"], child["parent_job_id"]) == ("parent", None)
    assert {j["id"] for j in listed} == {str(first), str(second)}
    shown = subprocess.run(
        [sys.executable, "-m", "service.cli", "jobs", "show", str(second), "--json"],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(shown.stdout)["job"]["parent"] == child["parent"]
