"""Per-edge scheduling: a step starts once its own upstream has settled, whatever else runs."""

import pytest

from tests.e2e.conftest import Client

pytestmark = pytest.mark.usefixtures("shared_worker")


def test_a_step_behind_a_fast_step_starts_before_a_slow_sibling_ends(client: Client) -> None:
    job_id = client.submit("edges", hold_s=3)
    view = client.wait_final(job_id)

    assert view.job.status == "succeeded", view.job.error
    steps = client.steps(job_id)
    assert steps["after_fast"].finished_at < steps["slow"].finished_at
    assert steps["join"].started_at >= steps["slow"].finished_at
    for name in ("fast", "slow", "after_fast", "join"):
        assert client.count(job_id, name, "started") == 1, name
    assert view.job.result == {"join": {"name": "join", "value": None}}


def test_a_failure_skips_what_needs_all_upstream_and_runs_what_needs_any(
    client: Client,
) -> None:
    job_id = client.submit("needs")
    view = client.wait_final(job_id)

    steps = client.steps(job_id)
    assert {step: s.status for step, s in steps.items()} == {
        "good": "succeeded",
        "bad": "failed",
        "needs_all": "skipped",
        "after_skipped": "skipped",
        "needs_any": "succeeded",
    }
    assert client.count(job_id, "needs_all", "started") == 0
    assert client.count(job_id, "needs_any") == 1
    assert view.job.status == "failed"
    assert view.job.error["details"] == {"steps": ["bad"]}


@pytest.mark.parametrize(
    ("mode", "ran", "skipped"),
    [
        ("quick", ["scan", "report"], ["full", "after_full"]),
        ("full", ["scan", "full", "after_full", "report"], []),
    ],
)
def test_a_false_condition_skips_its_step_and_what_needs_all_of_it(
    client: Client, mode: str, ran: list[str], skipped: list[str]
) -> None:
    job_id = client.submit("conditions", mode=mode)
    view = client.wait_final(job_id)

    assert view.job.status == "succeeded", view.job.error
    steps = client.steps(job_id)
    assert sorted(s for s, v in steps.items() if v.status == "skipped") == sorted(skipped)
    assert all(steps[s].status == "succeeded" for s in ran)
    assert all(client.count(job_id, s, "started") == 1 for s in ran)
    assert all(client.count(job_id, s, "started") == 0 for s in skipped)
    assert steps["full"].attempts == (1 if mode == "full" else 0)
    report = {"name": "report", "value": "full" if mode == "full" else None}
    assert view.job.result["report"] == report
