"""Approval routes: list what waits, decide once, refuse with a code otherwise."""

import uuid
from typing import Any

import redis
from fastapi.testclient import TestClient

from service.engine.runtime import Runtime
from service.engine.sweeper import sweep
from service.language.plan import load_plan
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from service.platform.models import JobRow
from tests.api.conftest import KeyFactory
from tests.support.approvals import parked_job

QUEUE = "flowbeat.steps"


def _error(response: Any, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code


def test_a_parked_step_is_listed_then_approved_once_and_sent(
    client: TestClient, make_key: KeyFactory, runtime: Runtime, broker: redis.Redis
) -> None:
    owner = f"approver-{uuid.uuid4().hex[:6]}"
    headers = {"Authorization": f"Bearer {make_key('read', 'write', owner=owner)}"}
    job_id = parked_job(client, headers, runtime)

    listed = client.get("/v1/approvals", headers=headers).json()["approvals"]
    assert [(a["job_id"], a["step_id"], a["status"]) for a in listed] == [
        (job_id, "gate", "pending")
    ]
    assert listed[0]["on_timeout"] == "escalate"
    before = broker.llen(QUEUE)

    approved = client.post(
        f"/v1/jobs/{job_id}/steps/gate/approve",
        json={"comment": "fine", "payload": {"n": 1}},
        headers=headers,
    )

    assert approved.status_code == 200, approved.text
    body = approved.json()
    assert (body["approval"]["status"], body["approval"]["decided_by"]) == ("approved", owner)
    assert body["approval"]["payload"] == {"n": 1}
    assert body["job"]["status"] == "running"
    assert broker.llen(QUEUE) == before + 1
    assert client.get("/v1/approvals", headers=headers).json()["approvals"] == []
    decided = client.get("/v1/approvals?status=approved", headers=headers).json()["approvals"]
    assert [a["job_id"] for a in decided] == [job_id]
    again = client.post(f"/v1/jobs/{job_id}/steps/gate/reject", json={}, headers=headers)
    _error(again, 409, "already_decided")


def test_decisions_that_cannot_be_taken_are_refused_with_their_code(
    client: TestClient, make_key: KeyFactory, runtime: Runtime
) -> None:
    writer = {"Authorization": f"Bearer {make_key('read', 'write')}"}
    reader = {"Authorization": f"Bearer {make_key('read')}"}
    stranger = {"Authorization": f"Bearer {make_key('read', 'write', owner='someone-else')}"}
    job_id = parked_job(client, writer, runtime)

    _error(
        client.post(f"/v1/jobs/{job_id}/steps/gate/approve", json={}, headers=reader),
        403,
        "forbidden",
    )
    _error(
        client.post(f"/v1/jobs/{job_id}/steps/gate/approve", json={}, headers=stranger),
        404,
        "job_not_found",
    )
    _error(
        client.post(f"/v1/jobs/{job_id}/steps/after/approve", json={}, headers=writer),
        409,
        "not_awaiting_approval",
    )
    _error(
        client.post(f"/v1/jobs/{uuid.uuid4()}/steps/gate/approve", json={}, headers=writer),
        404,
        "job_not_found",
    )
    _error(
        client.post(f"/v1/jobs/{job_id}/steps/gate/approve", json={"extra": 1}, headers=writer),
        422,
        "validation_error",
    )
    _error(client.get("/v1/approvals?status=bogus", headers=writer), 400, "invalid_query")
    assert client.get("/v1/approvals", headers=stranger).json()["approvals"] == []

    rejected = client.post(f"/v1/jobs/{job_id}/steps/gate/reject", json={}, headers=writer)
    assert rejected.status_code == 200, rejected.text
    assert rejected.json()["job"]["status"] == "failed"


def test_an_approval_given_while_the_broker_is_down_is_kept_for_the_sweeper(
    client: TestClient, broken_broker_client: TestClient, make_key: KeyFactory, runtime: Runtime
) -> None:
    headers = {"Authorization": f"Bearer {make_key('read', 'write')}"}
    job_id = parked_job(client, headers, runtime)

    approved = broken_broker_client.post(
        f"/v1/jobs/{job_id}/steps/gate/approve", json={}, headers=headers
    )

    assert approved.status_code == 200, approved.text
    assert approved.json()["approval"]["status"] == "approved"
    with unit_of_work(runtime.sessions) as session:
        job = session.get(JobRow, uuid.UUID(job_id))
        assert job is not None and job.status == "running" and job.dispatched_at is None
        report = sweep(
            session, now=utcnow(), broker_lost=False, stall_after_s=300, dispatch_grace_s=0
        )
        plan = load_plan(session, job.id)
    assert uuid.UUID(job_id) in report.redispatch
    assert plan is not None and [s.step_id for s in plan.steps] == ["gate"]
