"""Done is not success: a step's output is checked by its verify rules on a real worker before
the checkpoint counts, and a failed rule takes the retry path of any other failure."""

from typing import Any

import pytest

from tests.e2e.conftest import Client

pytestmark = pytest.mark.usefixtures("shared_worker")


def attempt_profile(name: str, rule: dict[str, Any]) -> dict[str, Any]:
    """``check`` returns ``{"attempt": n}``; ``rule`` decides which attempts pass."""
    return {
        "name": name,
        "steps": [
            {
                "id": "check",
                "action": "fail",
                "with": {"succeed_on_attempt": 1},
                "retry": {"attempts": 3, "backoff_s": 0.1, "jitter": 0},
                "verify": [{"not_empty": "attempt"}, rule],
            },
            {
                "id": "after",
                "action": "drill.count",
                "depends_on": ["check"],
                "with": {"name": "after"},
            },
        ],
    }


def test_an_output_that_fails_verification_is_retried_until_it_passes(client: Client) -> None:
    rule = {"expr": "${{ output.attempt }} >= 2", "message": "first attempts are drafts"}
    job_id = client.submit(attempt_profile("verify-retry", rule))
    view = client.wait_final(job_id)

    assert view.job.status == "succeeded", view.job.error
    check = client.steps(job_id)["check"]
    assert check.attempts == 2 and check.error is None
    assert client.checkpoints(job_id, "check") == 1
    assert client.count(job_id, "after") == 1


def test_a_rule_that_says_retry_false_fails_the_job_at_once(client: Client) -> None:
    rule = {"expr": "${{ output.attempt }} > 5", "message": "never good enough", "retry": False}
    job_id = client.submit(attempt_profile("verify-final", rule))
    view = client.wait_final(job_id)

    assert view.job.status == "failed"
    assert view.job.error is not None and view.job.error["code"] == "verification_failed"
    check = client.steps(job_id)["check"]
    assert check.attempts == 1
    assert check.error == {
        "code": "verification_failed",
        "message": "never good enough",
        "details": {
            "rule": "expr",
            "index": 1,
            "path": None,
            "reason": "${{ output.attempt }} > 5 is false",
        },
    }
    assert client.checkpoints(job_id, "check") == 0
    assert client.count(job_id, "after", "started") == 0


def test_a_for_each_step_verifies_each_items_output(client: Client) -> None:
    profile = {
        "name": "verify-each",
        "params": {"items": {"type": "array", "default": [1, 2, 3]}},
        "steps": [
            {
                "id": "each",
                "action": "sleep",
                "for_each": {"items": "${{ params.items }}", "max_parallel": 1},
                "with": {"seconds": 0, "result": "${{ item }}"},
                "verify": [{"expr": "${{ output }} != 2", "retry": False}],
            }
        ],
    }
    job_id = client.submit(profile)
    view = client.wait_final(job_id)

    assert view.job.status == "failed"
    assert view.job.error is not None and view.job.error["code"] == "verification_failed"
    assert client.steps(job_id)["each"].shards["failed"] == 1
