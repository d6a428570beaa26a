"""``GET /v1/rate-limits``: each key's limit, the units its window holds and the steps parked
for it, the steps listed only to those who may see their jobs; the NCBI limit is a key too."""

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.engine.claims import fast_claim
from service.engine.inputs import ready_claim
from service.engine.rates import parks_for_rate
from service.engine.runtime import Runtime
from service.engine.steps import StepKey
from service.platform.clock import utcnow
from service.platform.constants import NCBI_RATE_LIMIT_NAME
from service.platform.settings import Settings
from tests.api.test_ui import _login
from tests.support.apps import api_client

Headers = dict[str, str]


@pytest.fixture
def ui(settings: Settings, runtime: Runtime) -> Iterator[TestClient]:
    with api_client(settings, runtime) as client:
        client.follow_redirects = False
        yield client


def _rated(limit: int) -> dict[str, Any]:
    rate = {"key": "${{ params.tenant }}-lims", "limit": limit, "per_s": 60}
    step = {"id": "call", "action": "noop", "rate_limit": rate}
    return {"name": "rated", "params": {"tenant": {"type": "string"}}, "steps": [step]}


def _start(runtime: Runtime, job_id: str) -> bool:
    """Claim the job's step as a worker does and ask its rate: whether it parked."""
    key = StepKey(uuid.UUID(job_id), "call")
    with runtime.claims.connect() as conn:
        fast = fast_claim(conn, key, task_id="t", lease_s=30, now=utcnow())
    assert fast is not None
    claim = ready_claim(key, fast)
    assert claim is not None
    return parks_for_rate(runtime, claim)


def _key(client: TestClient, headers: Headers, key: str) -> dict[str, Any]:
    response = client.get("/v1/rate-limits", headers=headers)
    assert response.status_code == 200, response.text
    return next(k for k in response.json()["keys"] if k["key"] == key)


def test_a_key_shows_its_use_and_its_waiting_steps(
    client: TestClient, runtime: Runtime, writer: Headers, make_key: Any
) -> None:
    tenant = f"t{uuid.uuid4().hex[:8]}"
    body = {"pipeline": _rated(1), "params": {"tenant": tenant}}
    first, second = (
        client.post("/v1/jobs", json=body, headers=writer).json()["job"]["id"] for _ in "ab"
    )
    assert not _start(runtime, first)
    assert _start(runtime, second)

    seen = _key(client, writer, f"{tenant}-lims")
    assert (seen["limit"], seen["used"], seen["waiting"], seen["configured"]) == (1, 1, 1, False)
    assert [step["job_id"] for step in seen["steps"]] == [second]
    assert seen["next_wake_at"] == seen["steps"][0]["wake_at"]

    stranger = {"Authorization": f"Bearer {make_key('read')}"}
    shared = _key(client, stranger, f"{tenant}-lims")
    assert (shared["waiting"], shared["steps"]) == (1, []), "the count is shared, not the jobs"


def test_the_ncbi_limit_is_listed_as_a_configured_key(client: TestClient, writer: Headers) -> None:
    ncbi = _key(client, writer, NCBI_RATE_LIMIT_NAME)
    assert ncbi["configured"] and ncbi["limit"] >= 1


def test_the_dashboard_lists_a_key_with_the_viewers_waiting_steps(
    ui: TestClient, runtime: Runtime, make_key: Any
) -> None:
    key = make_key("read", "write")
    tenant = f"t{uuid.uuid4().hex[:8]}"
    body = {"pipeline": _rated(1), "params": {"tenant": tenant}}
    headers = {"Authorization": f"Bearer {key}"}
    first, second = (
        ui.post("/v1/jobs", json=body, headers=headers).json()["job"]["id"] for _ in "ab"
    )
    assert not _start(runtime, first) and _start(runtime, second)
    _login(ui, key)

    page = ui.get("/ui/rate-limits")

    assert page.status_code == 200
    row = page.text.split(f"<code>{tenant}-lims</code>", 1)[1]
    assert 'class="status awaiting_rate">1<' in row and second[:8] in row
