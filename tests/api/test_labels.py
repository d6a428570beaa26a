"""Labels on a job: given at submission, shown on the job, and found again by the list's
filter, with the error code and the time range beside them."""

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import update

from service.engine.runtime import Runtime
from service.platform.db import unit_of_work
from service.platform.models import JobRow
from tests.api.conftest import KeyFactory
from tests.api.test_audit import Caller
from tests.api.test_mcp_audit import _tools
from tests.support.arrange import walk

Headers = dict[str, str]


def _submit(client: TestClient, headers: Headers, labels: dict[str, Any]) -> str:
    body = {"pipeline": "greet", "params": {"who": "ada"}, "labels": labels}
    response = client.post("/v1/jobs", json=body, headers=headers)
    assert response.status_code == 202, response.text
    assert response.json()["job"]["labels"] == labels
    job_id: str = response.json()["job"]["id"]
    return job_id


def _listed(client: TestClient, headers: Headers, **query: Any) -> list[str]:
    response = client.get("/v1/jobs", params=query, headers=headers)
    assert response.status_code == 200, response.text
    return [job["id"] for job in response.json()["jobs"]]


def test_a_job_keeps_its_labels_and_the_list_finds_it_by_every_label_given(
    client: TestClient, writer: Headers
) -> None:
    both = _submit(client, writer, {"tenant": "acme", "study": "17"})
    acme = _submit(client, writer, {"tenant": "acme"})
    other = _submit(client, writer, {"tenant": "globex", "study": "17"})

    assert _listed(client, writer, label="tenant:acme") == [acme, both]
    assert _listed(client, writer, label=["tenant:acme", "study:17"]) == [both]
    assert _listed(client, writer, label="study=17") == [other, both]
    assert client.get(f"/v1/jobs/{both}", headers=writer).json()["job"]["labels"] == {
        "tenant": "acme",
        "study": "17",
    }


def test_labels_that_break_their_limits_are_refused_with_a_code_and_nothing_is_stored(
    client: TestClient, writer: Headers
) -> None:
    for labels in (
        {"study": 17},
        {"bad key": "x"},
        {"tenant": "x" * 256},
        {f"k{n}": "v" for n in range(17)},
    ):
        body = {"pipeline": "greet", "params": {"who": "ada"}, "labels": labels}
        response = client.post("/v1/jobs", json=body, headers=writer)
        assert response.status_code == 422, response.text
        assert response.json()["error"]["code"] == "labels_invalid"
    assert _listed(client, writer) == []


def test_a_label_filter_without_a_value_is_a_400(client: TestClient, writer: Headers) -> None:
    response = client.get("/v1/jobs", params={"label": "tenant"}, headers=writer)

    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "job_filter_invalid"


def test_the_list_filters_by_error_code_and_by_creation_time(
    client: TestClient, writer: Headers, runtime: Runtime
) -> None:
    old, unavailable, refused = (_submit(client, writer, {}) for _ in range(3))
    an_hour_ago = datetime.now(UTC) - timedelta(hours=1)
    with unit_of_work(runtime.sessions) as session:
        walk(session, JobRow, JobRow.id.in_([unavailable, refused]), to="failed")
        for job_id, status in ((unavailable, 503), (refused, 403)):
            error = {"code": "http_status", "message": "", "details": {"status": status}}
            if status == 403:
                error["code"] = "egress_refused"
            session.execute(update(JobRow).where(JobRow.id == job_id).values(error=error))
        session.execute(update(JobRow).where(JobRow.id == old).values(created_at=an_hour_ago))

    assert _listed(client, writer, error_code="http_status") == [unavailable]
    recent = _listed(client, writer, since=(an_hour_ago + timedelta(minutes=1)).isoformat())
    assert sorted(recent) == sorted([unavailable, refused])
    assert _listed(client, writer, until=(an_hour_ago + timedelta(minutes=1)).isoformat()) == [old]
    naive = client.get("/v1/jobs", params={"since": "2026-01-01T00:00:00"}, headers=writer)
    assert naive.json()["error"]["code"] == "job_filter_invalid"


LABELLED = {
    "name": "labelled",
    "params": {"tenant": {"type": "string"}, "study": {"type": "integer", "default": 17}},
    "labels": {"tenant": "${{ params.tenant }}", "study": "${{ params.study }}", "team": "lab"},
    "steps": [{"id": "only", "action": "noop"}],
}


def test_a_profiles_labels_read_its_params_and_a_submissions_own_labels_win(
    client: TestClient, writer: Headers
) -> None:
    body = {"pipeline": LABELLED, "params": {"tenant": "acme"}, "labels": {"team": "ops"}}
    response = client.post("/v1/jobs", json=body, headers=writer)

    assert response.status_code == 202, response.text
    assert response.json()["job"]["labels"] == {"tenant": "acme", "study": "17", "team": "ops"}
    assert _listed(client, writer, label="tenant:acme") == [response.json()["job"]["id"]]


def test_a_profile_label_that_reads_anything_but_params_is_refused_at_validation(
    client: TestClient, writer: Headers
) -> None:
    profile = {**LABELLED, "labels": {"step": "${{ steps.only.output }}"}}
    response = client.post("/v1/jobs", json={"pipeline": profile}, headers=writer)

    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "profile_invalid"


def test_mcp_runs_a_job_with_labels_and_finds_it_by_them(
    client: TestClient, runtime: Runtime, make_key: KeyFactory
) -> None:
    call = _tools(client, runtime, Caller(make_key, "read", "write"))
    tenant = f"t-{uuid.uuid4().hex[:8]}"

    job = call("run_pipeline", pipeline="greet", params={"who": "ada"}, labels={"tenant": tenant})
    call("run_pipeline", pipeline="greet", params={"who": "bob"}, labels={"tenant": "other"})
    found = call("find_jobs", labels={"tenant": tenant}, status=["queued"])

    assert job["job"]["labels"] == {"tenant": tenant}
    assert [(j["id"], j["labels"]) for j in found["jobs"]] == [
        (job["job"]["id"], {"tenant": tenant})
    ]
