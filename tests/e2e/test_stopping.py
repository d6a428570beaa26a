"""A running step whose job is cancelled stops in its own process, even when its action never
looks at its cancel: the worker's one slot is free for the next job, whose step nothing
disturbs, and no worker is told to signal a pool process from outside (Celery's
``terminate``, whose signal lands in whatever step that process runs by then)."""

from typing import Any

import pytest

from tests.e2e.conftest import Client, Cluster, wait_for

DEAF_HOLD_S = 60


def _deaf() -> dict[str, Any]:
    return {
        "name": "deaf",
        "steps": [
            {
                "id": "deaf",
                "action": "drill.count",
                "with": {"name": "deaf", "hold_s": DEAF_HOLD_S, "heed": False},
                "timeout_s": 2 * DEAF_HOLD_S,
            },
            {
                "id": "after",
                "action": "drill.count",
                "depends_on": ["deaf"],
                "with": {"name": "after"},
            },
        ],
    }


def _next() -> dict[str, Any]:
    return {
        "name": "next",
        "steps": [{"id": "x", "action": "drill.count", "with": {"name": "x", "hold_s": 2}}],
    }


@pytest.mark.timeout(90)
def test_a_step_deaf_to_its_cancel_is_stopped_and_the_next_job_runs_undisturbed(
    cluster: Cluster, client: Client
) -> None:
    worker = cluster.worker(concurrency=1)
    job_id = client.submit(_deaf())
    wait_for(lambda: client.count(job_id, "deaf", "started") == 1, 20, "the deaf step to start")

    client.cancel(job_id)
    nxt = client.submit(_next())
    done = client.wait_final(nxt, timeout_s=DEAF_HOLD_S / 3)

    assert done.job.status == "succeeded", done.job.error
    assert client.steps(nxt)["x"].attempts == 1, "the next job's step ran once, undisturbed"
    assert {s.step_id: s.status for s in client.view(job_id).steps} == {
        "deaf": "cancelled",
        "after": "cancelled",
    }
    assert client.count(job_id, "deaf") == 0, "the deaf step slept to its end"
    assert client.count(job_id, "after", "started") == 0
    assert client.checkpoints(job_id, "deaf") == 0
    assert "Terminating" not in worker.output(), "a worker was told to signal a pool process"
