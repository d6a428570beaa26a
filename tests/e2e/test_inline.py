"""A chain runs on in the message of its first step: each step's checkpoint claims the next,
and the same pool process runs it, each still held to its own timeout and retried at its own
backoff."""

import time
from typing import Any

import pytest

from tests.e2e.conftest import Client

pytestmark = pytest.mark.usefixtures("shared_worker")


def _chain(*steps: dict[str, Any]) -> dict[str, Any]:
    chained = [{"id": "s0", "action": "noop", **steps[0]}]
    for i, step in enumerate(steps[1:], start=1):
        chained.append({"id": f"s{i}", "action": "noop", "depends_on": [f"s{i - 1}"], **step})
    return {"name": f"inline-{time.monotonic_ns()}", "steps": chained}


def test_a_chain_runs_in_the_message_of_its_first_step(client: Client) -> None:
    profile = _chain(
        {"with": {"n": 1}},
        {"with": {"n": "${{ steps.s0.output.n }}"}},
        {"with": {"m": "${{ steps.s1.output.n }}"}},
    )
    job_id = client.submit(profile)
    view = client.wait_final(job_id)

    assert view.job.status == "succeeded", view.job.error
    assert {client.task_id(job_id, step) for step in ("s0", "s1", "s2")} == {
        client.task_id(job_id, "s0")
    }
    assert view.job.result == {"s2": {"m": 1}}


def test_siblings_go_out_as_their_own_messages_and_a_join_waits_for_both(
    client: Client,
) -> None:
    profile = {
        "name": f"inline-diamond-{time.monotonic_ns()}",
        "steps": [
            {"id": "root", "action": "noop"},
            {"id": "left", "action": "noop", "depends_on": ["root"]},
            {"id": "right", "action": "noop", "depends_on": ["root"]},
            {"id": "join", "action": "noop", "depends_on": ["left", "right"]},
        ],
    }
    job_id = client.submit(profile)
    view = client.wait_final(job_id)

    assert view.job.status == "succeeded", view.job.error
    root = client.task_id(job_id, "root")
    assert client.task_id(job_id, "left") == root
    assert client.task_id(job_id, "right") != root


def test_a_following_step_is_held_to_its_own_timeout(client: Client) -> None:
    """Its message's limits are the first step's (300 s); the worker's own timer stops it."""
    profile = _chain({}, {"action": "sleep", "timeout_s": 1, "with": {"seconds": 30}})
    job_id = client.submit(profile)
    view = client.wait_final(job_id, timeout_s=20)

    step = client.steps(job_id)["s1"]
    assert view.job.status == "failed"
    assert step.error["code"] == "timeout"
    assert client.task_id(job_id, "s1") == client.task_id(job_id, "s0")
    assert (step.finished_at - step.started_at).total_seconds() < 5


def test_a_step_whose_timeout_no_longer_fits_gets_a_message_of_its_own(client: Client) -> None:
    profile = _chain({"timeout_s": 1}, {"timeout_s": 300})
    job_id = client.submit(profile)
    view = client.wait_final(job_id)

    assert view.job.status == "succeeded", view.job.error
    assert client.task_id(job_id, "s1") != client.task_id(job_id, "s0")


def test_a_following_step_that_fails_is_retried_at_its_backoff(client: Client) -> None:
    """The retry is the message's own: delivered again, it goes on where it left off."""
    flaky = {
        "action": "fail",
        "retry": {"attempts": 3, "backoff_s": 0.1, "jitter": 0},
        "with": {"succeed_on_attempt": 3},
    }
    job_id = client.submit(_chain({}, flaky, {}))
    view = client.wait_final(job_id, timeout_s=20)

    assert view.job.status == "succeeded", view.job.error
    steps = client.steps(job_id)
    assert steps["s1"].attempts == 3 and steps["s2"].status == "succeeded"
