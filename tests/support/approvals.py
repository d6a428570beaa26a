"""A job parked at an approval gate, submitted through the API as a user would, for the tests
of the approval routes and of the dashboard's approve and reject buttons."""

import uuid

from fastapi.testclient import TestClient

from service.engine.claims import claim_step
from service.engine.runtime import Runtime
from service.engine.steps import StepKey
from service.platform.clock import utcnow
from service.platform.db import unit_of_work

GATED = {
    "name": "gated",
    "steps": [
        {"id": "gate", "action": "noop", "approval": {"on_timeout": "escalate"}},
        {"id": "after", "action": "noop", "depends_on": ["gate"]},
    ],
}


def parked_job(client: TestClient, headers: dict[str, str], runtime: Runtime) -> str:
    """A job whose first step reached its gate, as a worker's claim leaves it."""
    response = client.post("/v1/jobs", json={"pipeline": GATED}, headers=headers)
    assert response.status_code == 202, response.text
    job_id: str = response.json()["job"]["id"]
    with unit_of_work(runtime.sessions) as session:
        key = StepKey(uuid.UUID(job_id), "gate")
        assert claim_step(session, key, task_id="t", lease_s=30, now=utcnow()) is None
    return job_id
