"""Secrets through the API: a pipeline or a job that names a secret its owner lacks is refused
with 422 ``secret_not_found`` and nothing is stored; a secret in a URL's host is refused when
the profile is checked; the API shows the reference, never a value."""

import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from service.engine.runtime import Runtime
from service.platform.models import PipelineRow
from tests.api.conftest import KeyFactory

Headers = dict[str, str]


def pipeline(name: str, secret: str = "API_TOKEN", url: str = "https://api.example.com/v1") -> Any:
    return {
        "name": name,
        "steps": [
            {
                "id": "call",
                "action": "http.request",
                "with": {
                    "url": url,
                    "headers": {"Authorization": f"Bearer ${{{{ secrets.{secret} }}}}"},
                },
            }
        ],
    }


@pytest.fixture
def owner() -> str:
    return f"s{uuid.uuid4().hex[:8]}"


@pytest.fixture
def headers(make_key: KeyFactory, owner: str) -> Headers:
    return {"Authorization": f"Bearer {make_key('read', 'write', owner=owner)}"}


@pytest.fixture
def pipelines_count(runtime: Runtime) -> Callable[[], int]:
    def count() -> int:
        with runtime.sessions() as session:
            return session.scalar(select(func.count()).select_from(PipelineRow)) or 0

    return count


def put(client: TestClient, headers: Headers, document: Any) -> Any:
    return client.put(
        f"/v1/pipelines/{document['name']}",
        content=json.dumps(document),
        headers={**headers, "Content-Type": "application/json"},
    )


def refused(response: Any, code: str = "secret_not_found") -> dict[str, Any]:
    assert response.status_code == 422, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == code
    return error


def test_saving_a_pipeline_that_names_a_missing_secret_is_refused_and_stores_nothing(
    client: TestClient, headers: Headers, pipelines_count: Callable[[], int]
) -> None:
    before = pipelines_count()

    error = refused(put(client, headers, pipeline(f"p-{uuid.uuid4().hex[:8]}", "NOWHERE")))

    assert error["details"] == {"secrets": ["NOWHERE"]}
    assert pipelines_count() == before


def test_an_inline_job_that_names_a_missing_secret_is_refused_and_stores_nothing(
    client: TestClient, headers: Headers, job_count: Callable[[], int]
) -> None:
    before = job_count()
    body = {"pipeline": pipeline("inline-secret", "NOWHERE")}

    refused(client.post("/v1/jobs", json=body, headers=headers))

    assert job_count() == before


def test_a_job_of_a_saved_pipeline_is_refused_once_its_secret_is_gone(
    client: TestClient,
    headers: Headers,
    owner: str,
    job_count: Callable[[], int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The owner's own value counts; the job answer and the pipeline show only the name."""
    name = f"p-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(f"FLOWBEAT_SECRET_{owner}__API_TOKEN", "the-value-7c1d")
    saved = put(client, headers, pipeline(name))
    assert saved.status_code == 201, saved.text
    for _ in range(2):
        accepted = client.post("/v1/jobs", json={"pipeline": name}, headers=headers)
        assert accepted.status_code == 202, accepted.text
        assert "the-value-7c1d" not in accepted.text + saved.text
        assert "${{ secrets.API_TOKEN }}" in saved.text
    monkeypatch.delenv(f"FLOWBEAT_SECRET_{owner}__API_TOKEN")
    before = job_count()

    for _ in range(2):
        refused(client.post("/v1/jobs", json={"pipeline": name}, headers=headers))

    assert job_count() == before


def test_another_owners_secret_does_not_count(
    client: TestClient, headers: Headers, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOWBEAT_SECRET_someone_else__API_TOKEN", "theirs")

    refused(put(client, headers, pipeline(f"p-{uuid.uuid4().hex[:8]}")))


def test_a_deployment_secret_serves_every_owner(
    client: TestClient, headers: Headers, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOWBEAT_SECRET_SHARED_TOKEN", "shared")

    saved = put(client, headers, pipeline(f"p-{uuid.uuid4().hex[:8]}", "SHARED_TOKEN"))

    assert saved.status_code == 201, saved.text


def test_a_secret_in_a_urls_host_is_refused_at_save_and_submit(
    client: TestClient, headers: Headers, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOWBEAT_SECRET_API_TOKEN", "value")
    document = pipeline(f"p-{uuid.uuid4().hex[:8]}", url="https://${{ secrets.API_TOKEN }}.x.org/")

    saved = refused(put(client, headers, document), "profile_invalid")
    submitted = refused(
        client.post("/v1/jobs", json={"pipeline": document}, headers=headers), "profile_invalid"
    )

    for error in (saved, submitted):
        assert [e["code"] for e in error["details"]["errors"]] == ["secret_in_url_host"]
        assert error["details"]["errors"][0]["field"] == "steps[0].with.url"
