"""A job's deadline as a client sets and reads it: the profile's or the schedule's
``timeout_s``, shown as ``deadline_at``; a bound out of range is refused before anything is
stored."""

from datetime import datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.engine.runtime import Runtime
from service.platform.settings import Settings
from tests.api.conftest import KeyFactory
from tests.support.apps import api_client

Headers = dict[str, str]


def _timed(timeout_s: Any = None) -> dict[str, Any]:
    profile: dict[str, Any] = {"name": "timed", "steps": [{"id": "only", "action": "noop"}]}
    if timeout_s is not None:
        profile["timeout_s"] = timeout_s
    return profile


def test_a_job_shows_the_deadline_its_profile_gives_it(client: TestClient, writer: Headers) -> None:
    response = client.post("/v1/jobs", json={"pipeline": _timed(90)}, headers=writer)

    assert response.status_code == 202, response.text
    job = response.json()["job"]
    created = datetime.fromisoformat(job["created_at"])
    assert datetime.fromisoformat(job["deadline_at"]) == created + timedelta(seconds=90)
    got = client.get(f"/v1/jobs/{job['id']}", headers=writer).json()["job"]
    assert got["deadline_at"] == job["deadline_at"]


def test_the_dashboard_shows_an_open_job_s_deadline(
    settings: Settings, runtime: Runtime, make_key: KeyFactory
) -> None:
    key = make_key("read", "write")
    with api_client(settings, runtime) as ui:
        ui.follow_redirects = False
        submitted = ui.post(
            "/v1/jobs", json={"pipeline": _timed(90)}, headers={"Authorization": f"Bearer {key}"}
        )
        assert ui.post("/ui/login", data={"key": key}).status_code == 303
        panel = ui.get(f"/ui/jobs/{submitted.json()['job']['id']}/panel")

    assert panel.status_code == 200 and "· deadline " in panel.text


def test_a_job_without_a_timeout_has_no_deadline(client: TestClient, writer: Headers) -> None:
    response = client.post("/v1/jobs", json={"pipeline": _timed()}, headers=writer)

    assert response.status_code == 202, response.text
    assert response.json()["job"]["deadline_at"] is None


@pytest.mark.parametrize("timeout_s", [0, -5, 90 * 86400 + 1, "soon"])
def test_a_timeout_out_of_bounds_is_refused(
    client: TestClient, writer: Headers, timeout_s: Any
) -> None:
    response = client.post("/v1/jobs", json={"pipeline": _timed(timeout_s)}, headers=writer)

    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "profile_invalid"


def test_a_schedule_keeps_its_own_timeout(client: TestClient, writer: Headers) -> None:
    saved = client.put(
        "/v1/pipelines/greet/schedule",
        json={"every": "1d", "params": {"who": "ada"}, "timeout_s": 600},
        headers=writer,
    )

    assert saved.status_code == 200, saved.text
    assert saved.json()["schedule"]["timeout_s"] == 600
    got = client.get("/v1/pipelines/greet/schedule", headers=writer).json()
    assert got["schedule"]["timeout_s"] == 600
    client.delete("/v1/pipelines/greet/schedule", headers=writer)
