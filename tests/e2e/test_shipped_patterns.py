"""The shipped example of each execution pattern runs end to end on a real worker."""

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import Client, wait_for

pytestmark = pytest.mark.usefixtures("shared_worker")

SHIPPED = Path(__file__).resolve().parents[2] / "profiles"


def shipped(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((SHIPPED / f"{name}.yaml").read_text())
    return data


def test_the_review_loop_refines_until_the_review_passes(client: Client) -> None:
    view = client.wait_final(client.submit(shipped("review-loop"), rounds_needed=3))

    assert view.job.status == "succeeded", view.job.error
    draft = view.job.result["final"]["draft"]
    assert (draft["round"], draft["remarks"]) == (3, "round 2: cite the trials")


def test_the_release_gate_ships_what_the_approver_gave(client: Client) -> None:
    job_id = client.submit(shipped("release-gate"), version="2.1.0")
    wait_for(lambda: client.view(job_id).job.status == "awaiting_approval", 30, "the gate")

    client.decide(job_id, "ship", approve=True, payload={"channel": "stable"}, comment="go")
    view = client.wait_final(job_id)

    assert view.job.status == "succeeded", view.job.error
    assert view.job.result == {"announce": {"message": "go"}}


def test_the_verified_load_refuses_too_few_papers_at_once(client: Client) -> None:
    ok = client.wait_final(client.submit(shipped("verified-data")))
    short = client.wait_final(client.submit(shipped("verified-data"), min_papers=10_000))

    assert ok.job.status == "succeeded", ok.job.error
    assert short.job.status == "failed"
    count = {s.step_id: s for s in short.steps}["count"]
    assert (count.error["code"], count.attempts) == ("verification_failed", 1)
    assert count.error["message"] == "fewer papers than min_papers"


def test_the_etl_saga_undoes_what_it_did_when_the_load_fails(client: Client) -> None:
    ok = client.wait_final(client.submit(shipped("etl-saga")))
    failed_id = client.submit(shipped("etl-saga"), fail_load=True)
    failed = client.wait_final(failed_id)
    undone = wait_for(
        lambda: (c := client.view(failed_id).compensation) and c["status"] == "completed" and c,
        30,
        "the compensations",
    )

    assert ok.job.status == "succeeded", ok.job.error
    assert {s.step_id: s.status for s in ok.steps}["load"] == "skipped"
    assert ok.compensation is None
    assert failed.job.status == "failed"
    assert [s["step_id"] for s in undone["steps"]] == ["transform", "extract"]
