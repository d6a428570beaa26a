"""The signal route and MCP tool: a signal sends on the step parked for it, once per name; what
no step waits for, a second signal and a signal to a job that is over are refused with their
code."""

import uuid
from typing import Any

import anyio
import pytest
import redis
from fastapi.testclient import TestClient
from mcp.server.mcpserver.exceptions import ToolError

from api.mcp import McpDeps, build_mcp
from service.engine.claims import claim_step
from service.engine.runtime import Runtime
from service.engine.steps import StepKey
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from tests.api.conftest import KeyFactory

QUEUE = "flowbeat.steps"
WAITING = {
    "name": "paid",
    "steps": [
        {
            "id": "charge",
            "action": "noop",
            "wait_for": {"signal": "payment", "timeout_s": 600},
            "with": {"amount": "${{ signals.payment.payload.amount }}"},
        },
        {"id": "ship", "action": "noop", "depends_on": ["charge"]},
    ],
}


def _error(response: Any, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code


def _parked(client: TestClient, headers: dict[str, str], runtime: Runtime) -> str:
    """A job whose waiting step a worker claimed, as the claim leaves it: parked."""
    response = client.post("/v1/jobs", json={"pipeline": WAITING}, headers=headers)
    assert response.status_code == 202, response.text
    job_id: str = response.json()["job"]["id"]
    with unit_of_work(runtime.sessions) as session:
        key = StepKey(uuid.UUID(job_id), "charge")
        assert claim_step(session, key, task_id="t", lease_s=30, now=utcnow()) is None
    return job_id


def test_a_signal_sends_the_parked_step_on_once(
    client: TestClient, make_key: KeyFactory, runtime: Runtime, broker: redis.Redis
) -> None:
    owner = f"bank-{uuid.uuid4().hex[:6]}"
    headers = {"Authorization": f"Bearer {make_key('read', 'write', owner=owner)}"}
    job_id = _parked(client, headers, runtime)
    steps = client.get(f"/v1/jobs/{job_id}", headers=headers).json()["job"]["steps"]
    assert {s["step_id"]: s["status"] for s in steps}["charge"] == "awaiting_signal"
    before = broker.llen(QUEUE)

    sent = client.post(
        f"/v1/jobs/{job_id}/signals/payment", json={"payload": {"amount": 7}}, headers=headers
    )

    assert sent.status_code == 200, sent.text
    body = sent.json()
    assert body["signal"]["name"] == "payment"
    assert (body["signal"]["payload"], body["signal"]["sent_by"]) == ({"amount": 7}, owner)
    assert body["signal"]["resumed"] == ["charge"]
    assert body["job"]["status"] == "running"
    assert broker.llen(QUEUE) == before + 1
    again = client.post(f"/v1/jobs/{job_id}/signals/payment", json={}, headers=headers)
    _error(again, 409, "signal_already_received")


def test_signals_that_cannot_be_taken_are_refused_with_their_code(
    client: TestClient, make_key: KeyFactory, runtime: Runtime
) -> None:
    writer = {"Authorization": f"Bearer {make_key('read', 'write')}"}
    reader = {"Authorization": f"Bearer {make_key('read')}"}
    stranger = {"Authorization": f"Bearer {make_key('read', 'write', owner='someone-else')}"}
    job_id = _parked(client, writer, runtime)
    url = f"/v1/jobs/{job_id}/signals/payment"

    _error(client.post(url, json={}, headers=reader), 403, "forbidden")
    _error(client.post(url, json={}, headers=stranger), 404, "job_not_found")
    _error(
        client.post(f"/v1/jobs/{job_id}/signals/refund", json={}, headers=writer),
        404,
        "signal_not_awaited",
    )
    _error(client.post(url, json={"amount": 1}, headers=writer), 422, "validation_error")
    assert client.post(f"/v1/jobs/{job_id}/cancel", headers=writer).status_code == 200
    _error(client.post(url, json={}, headers=writer), 409, "job_conflict")


def test_a_signal_before_the_step_waits_is_kept(
    client: TestClient, make_key: KeyFactory, runtime: Runtime
) -> None:
    headers = {"Authorization": f"Bearer {make_key('read', 'write')}"}
    response = client.post("/v1/jobs", json={"pipeline": WAITING}, headers=headers)
    job_id = response.json()["job"]["id"]

    sent = client.post(
        f"/v1/jobs/{job_id}/signals/payment", json={"payload": {"amount": 2}}, headers=headers
    )

    assert sent.status_code == 200, sent.text
    assert sent.json()["signal"]["resumed"] == []
    with unit_of_work(runtime.sessions) as session:
        held = claim_step(
            session, StepKey(uuid.UUID(job_id), "charge"), task_id="t", lease_s=30, now=utcnow()
        )
    assert held is not None, "the stored signal lets the step run at once"


def test_the_mcp_tool_sends_a_signal_as_the_route_does(
    client: TestClient, make_key: KeyFactory, runtime: Runtime
) -> None:
    owner = f"agent-{uuid.uuid4().hex[:6]}"
    key = make_key("read", "write", owner=owner)
    job_id = _parked(client, {"Authorization": f"Bearer {key}"}, runtime)
    state = client.app.state  # type: ignore[attr-defined]
    server = build_mcp(McpDeps(state.settings, runtime, state.celery_app, state.keys, token=key))

    async def send(name: str) -> Any:
        return await server.call_tool("send_signal", {"job_id": job_id, "name": name})

    sent = anyio.run(send, "payment").structured_content
    with pytest.raises(ToolError, match="signal_already_received: "):
        anyio.run(send, "payment")

    assert sent["signal"]["resumed"] == ["charge"]
    assert sent["signal"]["sent_by"] == owner
