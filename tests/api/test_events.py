"""The stream routes' refusals, answered before any stream opens."""

import uuid

import pytest
from fastapi.testclient import TestClient

Headers = dict[str, str]


def _job(client: TestClient, writer: Headers) -> str:
    answer = client.post(
        "/v1/jobs", json={"pipeline": "greet", "params": {"who": "ev"}}, headers=writer
    )
    assert answer.status_code == 202, answer.text
    job_id: str = answer.json()["job"]["id"]
    return job_id


def test_a_stream_needs_a_key(client: TestClient, writer: Headers) -> None:
    answer = client.get(f"/v1/jobs/{_job(client, writer)}/events")
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == "unauthorized"


def test_an_unknown_job_has_no_stream(client: TestClient, writer: Headers) -> None:
    answer = client.get(f"/v1/jobs/{uuid.uuid4()}/events", headers=writer)
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "job_not_found"


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/v1/jobs/{job}/events", {"last-event-id": "yesterday"}),
        ("/v1/events?since=2026-11-24T10:00:00", {}),
        ("/v1/events", {"last-event-id": "not-a-time"}),
    ],
)
def test_a_resume_point_that_means_nothing_is_refused(
    client: TestClient, writer: Headers, path: str, headers: Headers
) -> None:
    answer = client.get(path.format(job=_job(client, writer)), headers={**writer, **headers})
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "invalid_query"


def test_a_sync_wait_is_bounded(client: TestClient, writer: Headers) -> None:
    answer = client.post(
        "/v1/jobs",
        json={"pipeline": "greet", "params": {"who": "ev"}, "mode": "sync", "wait_s": 3600},
        headers=writer,
    )
    assert answer.status_code == 422
    assert answer.json()["error"]["code"] == "validation_error"


def test_the_openapi_document_describes_both_stream_formats(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for path in ("/v1/jobs/{job_id}/events", "/v1/events"):
        content = paths[path]["get"]["responses"]["200"]["content"]
        assert set(content) == {"text/event-stream", "application/x-ndjson"}
