"""A worker's JSON log names the work of every line it writes while running a job's tasks:
the engine's, an action's and Celery's own lines about the task carry the job and the step,
and lines written during an attempt carry the attempt too."""

import json
from typing import Any

import pytest

from service.platform.constants import TASK_SWEEP
from tests.e2e.conftest import Client, Cluster

STEPS = {"flaky", "each", "after"}
MAINTENANCE_LOGGERS = {"tasks.sweep", "service.engine.sweeper", "service.catalogue.retention"}
PROFILE = {
    "name": "logged",
    "params": {"items": {"type": "array", "default": [1, 2, 3]}},
    "steps": [
        {
            "id": "flaky",
            "action": "fail",
            "with": {"succeed_on_attempt": 2},
            "retry": {"attempts": 2, "backoff_s": 0.1, "jitter": 0},
        },
        {
            "id": "each",
            "action": "drill.count",
            "depends_on": ["flaky"],
            "for_each": {"items": "${{ params.items }}", "max_parallel": 2},
            "with": {"name": "logged-each", "value": "${{ item }}"},
        },
        {
            "id": "after",
            "action": "drill.count",
            "depends_on": ["each"],
            "with": {"name": "logged-after"},
        },
    ],
}


def _lines(text: str) -> list[dict[str, Any]]:
    found = []
    for raw in text.splitlines():
        try:
            line = json.loads(raw)
        except json.JSONDecodeError:
            continue
        if isinstance(line, dict):
            found.append(line)
    return found


def _other_work(line: dict[str, Any], job_id: str) -> bool:
    """The same queue also brings the sweeper's passes, which belong to no job, and may bring
    a job an earlier test of this process left behind, whose lines name that job."""
    other_job = line.get("job_id") not in (None, job_id)
    sweep = line["logger"] in MAINTENANCE_LOGGERS or TASK_SWEEP in line["message"]
    return other_job or sweep


@pytest.mark.timeout(120)
def test_every_line_a_worker_logs_while_running_a_job_carries_its_ids(
    client: Client, cluster: Cluster
) -> None:
    worker = cluster.worker(log_format="json")
    job_id = client.submit(PROFILE)
    assert client.wait_final(job_id).job.status == "succeeded"
    cluster.close()

    pool = [
        line
        for line in _lines(worker.output())
        if line["process"] != worker.popen.pid and not _other_work(line, str(job_id))
    ]

    assert pool, "the pool processes logged nothing"
    unnamed = [line for line in pool if line.get("job_id") != str(job_id)]
    assert not unnamed, f"lines without the job: {unnamed[:3]}"
    assert {line.get("step_id") for line in pool} == STEPS
    trace = [line["message"] for line in pool if line["logger"] == "celery.app.trace"]
    assert any(" retry: " in message for message in trace), trace
    assert any(" succeeded in " in message for message in trace), trace
    action = [line for line in pool if line["logger"] == "tests.drill_actions"]
    assert len(action) == 4
    assert all(line.get("attempt") == 1 for line in action)
