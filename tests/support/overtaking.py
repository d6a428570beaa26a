"""An urgent job posted to a live API behind a backlog of its own owner's, and which of that
backlog started before it: what a priority promises, read from the steps' start times."""

import uuid
from typing import Any

import httpx

from service.platform.auth import create_api_key
from service.platform.db import unit_of_work
from tests.e2e.conftest import Client

BACKLOG = 8
URGENT = 9


def post_backlog_then_urgent(
    client: Client, base: str, profile: dict[str, Any], **params: Any
) -> tuple[list[uuid.UUID], uuid.UUID]:
    """``BACKLOG`` jobs of priority 0, then one of priority ``URGENT``, posted one after the
    other by one new owner while no worker runs: the backlog's ids and the urgent one's."""
    owner = f"urgent-{uuid.uuid4().hex[:6]}"
    with unit_of_work(client.rt.sessions) as session:
        key, _ = create_api_key(session, owner=owner, scopes=("write",))

    def post(priority: int) -> uuid.UUID:
        answer = httpx.post(
            f"{base}/v1/jobs",
            json={"pipeline": profile, "params": params, "priority": priority},
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )
        assert answer.status_code == 202, answer.text
        return uuid.UUID(answer.json()["job"]["id"])

    low = [post(0) for _ in range(BACKLOG)]
    return low, post(URGENT)


def started_before(
    client: Client, low: list[uuid.UUID], urgent: uuid.UUID, step: str
) -> list[uuid.UUID]:
    """Once every job has succeeded, those of ``low`` whose ``step`` started before the
    urgent job's."""
    for job in [*low, urgent]:
        assert client.wait_final(job, timeout_s=90).job.status == "succeeded"
    started = {job: client.steps(job)[step].started_at for job in [*low, urgent]}
    return [job for job in low if started[job] < started[urgent]]
