"""Sagas through the API: a job shows its compensation, an operator lists those that failed,
and cancelling a saga sends its compensations after the commit."""

import json
import uuid
from typing import Any

import redis
from fastapi.testclient import TestClient

from service.engine.runner import run_step
from service.engine.runtime import Runtime
from service.engine.saga import run_compensation
from service.engine.steps import StepKey

Headers = dict[str, str]
QUEUE = "flowbeat.steps"


def saga(*, last: str = "fail", on_cancel: str = "compensate") -> dict[str, Any]:
    """book -> charge -> ship; the undo of ``charge`` cannot succeed, and ``ship`` fails."""
    return {
        "name": f"saga-{uuid.uuid4().hex[:8]}",
        "on_cancel": on_cancel,
        "steps": [
            {"id": "book", "action": "noop", "compensate": {"action": "noop"}},
            {
                "id": "charge",
                "action": "noop",
                "depends_on": ["book"],
                "compensate": {
                    "action": "fail",
                    "with": {"message": "the refund was refused", "retryable": False},
                },
            },
            {
                "id": "ship",
                "action": last,
                "depends_on": ["charge"],
                "with": {"retryable": False} if last == "fail" else {"seconds": 60},
            },
        ],
    }


def _submit(client: TestClient, headers: Headers, profile: dict[str, Any]) -> uuid.UUID:
    response = client.post("/v1/jobs", json={"pipeline": profile}, headers=headers)
    assert response.status_code == 202, response.text
    return uuid.UUID(response.json()["job"]["id"])


def _run(runtime: Runtime, job_id: uuid.UUID, *steps: str) -> None:
    for step_id in steps:
        run_step(runtime, StepKey(job_id, step_id), task_id=uuid.uuid4().hex)


def _compensate_messages(broker: redis.Redis, job_id: uuid.UUID) -> int:
    messages = [json.loads(raw) for raw in broker.lrange(QUEUE, 0, -1)]
    return sum(
        message["headers"]["task"] == "flowbeat.compensate"
        and message["headers"]["argsrepr"].startswith(f"('{job_id}'")
        for message in messages
    )


def test_a_failed_saga_shows_its_compensation_and_is_listed_while_one_failed_for_good(
    client: TestClient, writer: Headers, runtime: Runtime
) -> None:
    job_id = _submit(client, writer, saga())
    _run(runtime, job_id, "book", "charge", "ship")
    run_compensation(runtime, job_id, "charge")
    run_compensation(runtime, job_id, "book")

    job = client.get(f"/v1/jobs/{job_id}", headers=writer).json()["job"]
    flagged = client.get("/v1/jobs?status=failed&compensation=failed", headers=writer).json()

    assert job["status"] == "failed"
    assert job["compensation"]["status"] == "failed"
    assert [(s["step_id"], s["status"]) for s in job["compensation"]["steps"]] == [
        ("charge", "compensation_failed"),
        ("book", "compensated"),
    ]
    assert job["compensation"]["steps"][0]["error"]["message"] == "the refund was refused"
    assert str(job_id) in [listed["id"] for listed in flagged["jobs"]]


def test_a_job_with_nothing_to_undo_shows_no_compensation_and_is_not_listed(
    client: TestClient, writer: Headers
) -> None:
    job_id = _submit(client, writer, saga())

    job = client.get(f"/v1/jobs/{job_id}", headers=writer).json()["job"]
    flagged = client.get("/v1/jobs?compensation=failed", headers=writer).json()

    assert job["compensation"] is None
    assert str(job_id) not in [listed["id"] for listed in flagged["jobs"]]


def test_only_failed_compensations_can_be_listed(client: TestClient, writer: Headers) -> None:
    response = client.get("/v1/jobs?compensation=completed", headers=writer)

    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_query"


def test_cancelling_a_saga_sends_its_compensations_unless_it_leaves_them(
    client: TestClient, writer: Headers, runtime: Runtime, broker: redis.Redis
) -> None:
    undone = _submit(client, writer, saga(last="sleep"))
    left = _submit(client, writer, saga(last="sleep", on_cancel="leave"))
    for job_id in (undone, left):
        _run(runtime, job_id, "book", "charge")

    cancelled = [client.post(f"/v1/jobs/{j}/cancel", headers=writer) for j in (undone, left)]

    assert [response.status_code for response in cancelled] == [200, 200]
    assert cancelled[0].json()["job"]["compensation"]["status"] == "running"
    assert cancelled[1].json()["job"]["compensation"] is None
    assert _compensate_messages(broker, undone) == 1
    assert _compensate_messages(broker, left) == 0
