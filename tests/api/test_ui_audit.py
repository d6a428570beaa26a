"""The dashboard in the audit trail: its buttons record their changes as the ``ui`` channel,
a button refused for its token or scope records nothing, and ``/ui/audit`` shows the trail
to admin keys only."""

import re
import uuid
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from service.engine.runtime import Runtime
from service.platform.settings import Settings
from tests.api.conftest import KeyFactory
from tests.api.test_audit import Caller, events
from tests.support.approvals import parked_job
from tests.support.apps import api_client


@pytest.fixture
def ui(settings: Settings, runtime: Runtime) -> Iterator[TestClient]:
    with api_client(settings, runtime) as client:
        client.follow_redirects = False
        yield client


def _login(ui: TestClient, caller: Caller) -> str:
    """Logs in and returns the page token."""
    assert ui.post("/ui/login", data={"key": caller.key}).status_code == 303
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', ui.get("/ui/jobs").text)
    assert found
    return found.group(1)


def _submit(ui: TestClient, caller: Caller) -> str:
    body = {"pipeline": "greet", "params": {"who": "ada"}}
    answer = ui.post("/v1/jobs", json=body, headers=caller.headers)
    assert answer.status_code == 202, answer.text
    return str(answer.json()["job"]["id"])


def test_the_cancel_button_records_the_ui_channel_and_its_route(
    ui: TestClient, make_key: KeyFactory, runtime: Runtime
) -> None:
    caller = Caller(make_key, "write")
    job_id = _submit(ui, caller)
    token = _login(ui, caller)

    assert ui.post(f"/ui/jobs/{job_id}/cancel", data={"csrf": "bad"}).status_code == 403
    assert ui.post(f"/ui/jobs/{job_id}/cancel", data={"csrf": token}).status_code == 303

    submit, cancel = events(runtime, caller.owner)
    assert (submit.channel, submit.action) == ("api", "job.submit")
    assert (cancel.channel, cancel.source) == ("ui", "POST /ui/jobs/{job_id}/cancel")
    assert (cancel.action, cancel.target_id, cancel.actor) == ("job.cancel", job_id, caller.prefix)


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_a_decision_button_records_the_ui_channel(
    ui: TestClient, make_key: KeyFactory, runtime: Runtime, decision: str
) -> None:
    caller = Caller(make_key, "read", "write")
    job_id = parked_job(ui, caller.headers, runtime)
    token = _login(ui, caller)

    ui.post(f"/ui/jobs/{job_id}/steps/gate/{decision}", data={"csrf": token})

    decided = events(runtime, caller.owner)[-1]
    assert (decided.channel, decided.action) == ("ui", f"job.{decision}")
    assert decided.source == "POST /ui/jobs/{job_id}/steps/{step_id}/{decision}"


def test_a_button_a_read_key_may_not_press_records_nothing(
    ui: TestClient, make_key: KeyFactory, runtime: Runtime
) -> None:
    job_id = _submit(ui, Caller(make_key, "write"))
    reader = Caller(make_key, "read")
    token = _login(ui, reader)

    assert ui.post(f"/ui/jobs/{job_id}/cancel", data={"csrf": token}).status_code == 403
    assert events(runtime, reader.owner) == []


def test_the_audit_page_shows_the_trail_to_admin_keys_only(
    ui: TestClient, make_key: KeyFactory, runtime: Runtime
) -> None:
    writer = Caller(make_key, "write")
    job_id = _submit(ui, writer)
    _login(ui, writer)
    assert ui.get("/ui/audit").status_code == 403

    admin = Caller(make_key, "admin")
    _login(ui, admin)
    page = ui.get("/ui/audit", params={"target": f"job:{job_id}"})
    other = ui.get("/ui/audit", params={"target": f"job:{uuid.uuid4()}"})
    bad = ui.get("/ui/audit", params={"since": "yesterday"})

    assert page.status_code == 200
    assert f'<a href="/ui/jobs/{job_id}">{job_id}</a>' in page.text
    assert "job.submit" in page.text and writer.prefix in page.text
    assert "No changes recorded." in other.text
    assert bad.status_code == 400 and "invalid_query" in bad.text
