"""``flowbeat_client`` against a live API (uvicorn in a subprocess) and a real worker: what a
user's script does, and the typed error it gets when the API refuses."""

import uuid

import pytest

from flowbeat_client import Client, FlowbeatApiError, JobWaitTimeout
from service.platform.auth import create_api_key
from service.platform.db import unit_of_work
from tests.e2e.conftest import Client as StackClient
from tests.e2e.conftest import Cluster, Proc, wait_for

MINE = """\
name: client-check
params:
  papers: {type: array, default: []}
steps:
  - id: fetch
    action: noop
    with: {papers: "${{ params.papers }}"}
  - id: sorted
    action: data.sort
    depends_on: [fetch]
    with: {items: "${{ steps.fetch.output.papers }}", field: pmid}
result: {step: sorted, items: "", key: pmid}
schedule: {cron: "0 6 * * 1", timezone: Europe/Paris}
"""


@pytest.fixture
def fb(cluster: Cluster, client: StackClient) -> Client:
    base = cluster.api()
    with unit_of_work(client.rt.sessions) as session:
        key, _ = create_api_key(session, owner=f"sdk-{uuid.uuid4().hex[:6]}", scopes=["write"])
    return Client(base, key)


def test_a_script_saves_runs_waits_diffs_and_reruns(fb: Client, shared_worker: Proc) -> None:
    with fb:
        saved = fb.pipelines.put("client-check", MINE)
        assert (saved["name"], saved["version"]) == ("client-check", 1)
        assert "client-check" in [p["name"] for p in fb.pipelines.list()]
        assert fb.pipelines.get("client-check")["profile"]["steps"][0]["id"] == "fetch"

        first = fb.jobs.create("client-check", {"papers": [{"pmid": "1"}]})
        assert fb.jobs.wait(first["id"], timeout_s=60)["status"] == "succeeded"
        second = fb.jobs.create("client-check", {"papers": [{"pmid": "1"}, {"pmid": "2"}]})
        done = fb.jobs.wait(second["id"], timeout_s=60)

        assert done["status"] == "succeeded"
        assert [step["status"] for step in done["steps"]] == ["succeeded", "succeeded"]
        assert fb.jobs.diff(second["id"])["items"] == [{"pmid": "2"}]
        assert [run["job_id"] for run in fb.runs.list("client-check")["runs"]] == [
            second["id"],
            first["id"],
        ]
        rerun = fb.jobs.rerun(second["id"], from_step="sorted")
        assert rerun["parent_job_id"] == second["id"]
        assert fb.jobs.wait(rerun["id"], timeout_s=60)["status"] == "succeeded"
        assert second["id"] in [job["id"] for job in fb.jobs.list(pipeline="client-check")["jobs"]]

        schedule = fb.schedules.put("client-check")
        assert (schedule["cron"], schedule["enabled"]) == ("0 6 * * 1", True)
        assert fb.schedules.get("client-check")["id"] == schedule["id"]
        assert [s["pipeline"] for s in fb.schedules.list()] == ["client-check"]
        monthly = fb.schedules.put(
            "client-check", {"cron": "0 6 1 * *", "priority": 8}, schedule="monthly"
        )
        assert (monthly["name"], monthly["priority"]) == ("monthly", 8)
        daily = fb.schedules.add("client-check", {"name": "daily", "cron": "0 6 * * *"})
        assert [s["name"] for s in fb.schedules.list("client-check")] == [None, "daily", "monthly"]
        with pytest.raises(FlowbeatApiError) as ambiguous:
            fb.schedules.get("client-check")
        assert (ambiguous.value.status, ambiguous.value.code) == (409, "schedule_ambiguous")
        assert fb.schedules.get("client-check", daily["id"])["name"] == "daily"
        backfill = fb.schedules.backfill(
            "client-check",
            "monthly",
            start="2026-01-01T00:00:00Z",
            end="2026-07-01T00:00:00Z",
            max_active=2,
        )
        assert (backfill["total"], backfill["status"]) == (6, "running")
        assert [b["id"] for b in fb.schedules.backfills("client-check")] == [backfill["id"]]
        cancelled = fb.schedules.cancel_backfill("client-check", "monthly", backfill["id"])
        assert cancelled["status"] == "cancelled"
        fb.schedules.delete("client-check", "daily")
        fb.schedules.delete("client-check", "monthly")
        fb.schedules.delete("client-check")
        assert fb.pipelines.delete("client-check", purge_history=True) == 3


def test_refusals_raise_the_typed_error_with_the_code(fb: Client, cluster: Cluster) -> None:
    with fb:
        with pytest.raises(FlowbeatApiError) as missing:
            fb.jobs.get(str(uuid.uuid4()))
        assert (missing.value.status, missing.value.code) == (404, "job_not_found")
        with pytest.raises(FlowbeatApiError) as invalid:
            fb.jobs.create("client-never-saved")
        assert invalid.value.code == "pipeline_not_found"
        with pytest.raises(FlowbeatApiError) as bad_yaml:
            fb.pipelines.put("broken", "name: broken\nsteps: [")
        assert (bad_yaml.value.status, bad_yaml.value.code) == (422, "profile_invalid")
        with pytest.raises(FlowbeatApiError) as no_schedule:
            fb.schedules.get("client-check")
        assert no_schedule.value.code == "schedule_not_found"
    with Client(cluster.api(), "fb_notakey_x") as stranger, pytest.raises(FlowbeatApiError) as no:
        stranger.pipelines.list()
    assert (no.value.status, no.value.code) == (401, "unauthorized")


def test_wait_gives_up_at_a_gate_and_approve_lets_the_job_finish(
    fb: Client, shared_worker: Proc
) -> None:
    gated = {"name": "client-gate", "steps": [{"id": "ship", "action": "noop", "approval": {}}]}
    with fb:
        job = fb.jobs.create(gated)
        with pytest.raises(JobWaitTimeout) as gave_up:
            fb.jobs.wait(job["id"], timeout_s=3, poll_s=0.1)
        assert gave_up.value.status in {"queued", "running", "awaiting_approval"}

        waiting = wait_for(
            lambda: (seen := fb.jobs.get(job["id"]))["status"] == "awaiting_approval" and seen,
            60,
            "the gate",
        )
        assert waiting["steps"][0]["status"] == "awaiting_approval"
        fb.jobs.approve(job["id"], "ship", comment="go", payload={"v": 1})
        assert fb.jobs.wait(job["id"], timeout_s=60)["status"] == "succeeded"
        with pytest.raises(FlowbeatApiError) as twice:
            fb.jobs.reject(job["id"], "ship")
        assert (twice.value.status, twice.value.code) == (409, "already_decided")


def test_submit_tells_a_job_its_dedupe_window_gave_back_from_a_new_one(fb: Client) -> None:
    search = {
        "name": "client-dedupe",
        "params": {"query": {"type": "string", "required": True}},
        "dedupe": {"key": "${{ params.query }}", "window_s": 3600},
        "steps": [{"id": "only", "action": "noop"}],
    }
    with fb:
        first = fb.jobs.submit(search, {"query": "sepsis"})
        again = fb.jobs.submit(search, {"query": "sepsis"})
        other = fb.jobs.submit(search, {"query": "asthma"})

    assert not first["deduplicated"] and not other["deduplicated"]
    assert again["deduplicated"] and again["job"]["id"] == first["job"]["id"]
    assert other["job"]["id"] != first["job"]["id"]
