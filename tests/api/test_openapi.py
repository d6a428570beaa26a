"""The OpenAPI document says what the API does: the bearer scheme where a key is needed, the
error envelope under the statuses routes answer with, and the pipeline PUT's YAML body."""

import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.errors import STATUS_BY_CODE
from service.engine.runtime import Runtime
from service.platform.settings import Settings
from tests.api.conftest import KeyFactory
from tests.support.apps import api_client

METHODS = {"get", "put", "post", "delete", "patch"}


@pytest.fixture(scope="module")
def document(client: TestClient) -> dict[str, Any]:
    answer = client.get("/openapi.json")
    assert answer.status_code == 200
    schema: dict[str, Any] = answer.json()
    return schema


SIGNED = {("/v1/hooks/{name}", "post")}
"""Operations whose credential is a signature over the body, not an API key."""


def _operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (path, method, operation)
        for path, item in document["paths"].items()
        for method, operation in item.items()
        if method in METHODS
    ]


def _is_envelope(response: dict[str, Any]) -> bool:
    schema = response.get("content", {}).get("application/json", {}).get("schema", {})
    return bool(schema.get("$ref") == "#/components/schemas/ErrorEnvelope")


def test_the_bearer_scheme_covers_every_operation_but_health(document: dict[str, Any]) -> None:
    scheme = document["components"]["securitySchemes"]["bearer"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    for path, method, operation in _operations(document):
        if path == "/health":
            assert "security" not in operation
        elif (path, method) in SIGNED:
            assert operation["security"] == [], (method, path)
        else:
            assert operation["security"] == [{"bearer": []}], (method, path)


KEYED = {401, 403, 429, 503}
"""What any operation behind a key can answer: no key, the wrong scope, too many requests,
and the database that holds the keys out of reach."""
BODY = {413, 422}
"""A body the route reads itself: too large, or not what it takes."""
PARSED_BODY = BODY | {400}
"""A body FastAPI reads: bytes that are not UTF-8 JSON are a 400 as well."""

BACKFILL = "/v1/pipelines/{name}/schedules/{schedule}/backfill"
ANSWERS: dict[tuple[str, str], set[int]] = {
    ("get", "/health"): {200, 503},
    ("get", "/metrics"): {200} | KEYED,
    ("get", "/v1/queues"): {200} | KEYED,
    ("get", "/v1/rate-limits"): {200} | KEYED,
    ("get", "/v1/overview"): {200, 400} | KEYED,
    ("get", "/v1/actions"): {200} | KEYED,
    ("get", "/v1/audit"): {200, 400} | KEYED,
    ("post", "/v1/jobs"): {200, 202, 404, 409} | PARSED_BODY | KEYED,
    ("get", "/v1/jobs"): {200, 400} | KEYED,
    ("get", "/v1/jobs/{job_id}"): {200, 400, 404, 410} | KEYED,
    ("post", "/v1/jobs/{job_id}/cancel"): {200, 400, 404, 409} | KEYED,
    ("post", "/v1/jobs/{job_id}/rerun"): {202, 400, 404, 409} | PARSED_BODY | KEYED,
    ("post", "/v1/jobs/cancel"): {200, 400, 404, 409} | PARSED_BODY | KEYED,
    ("post", "/v1/jobs/rerun"): {200, 400, 404, 409} | PARSED_BODY | KEYED,
    ("get", "/v1/jobs/bulk/{bulk_id}"): {200, 400, 404} | KEYED,
    ("get", "/v1/jobs/{job_id}/events"): {200, 400, 404, 410} | KEYED,
    ("get", "/v1/jobs/{job_id}/steps/{step_id}/logs"): {200, 400, 404, 410} | KEYED,
    ("get", "/v1/events"): {200, 400} | KEYED,
    ("post", "/v1/jobs/{job_id}/steps/{step_id}/approve"): {200, 400, 404, 409}
    | PARSED_BODY
    | KEYED,
    ("post", "/v1/jobs/{job_id}/steps/{step_id}/reject"): {200, 400, 404, 409}
    | PARSED_BODY
    | KEYED,
    ("get", "/v1/approvals"): {200, 400} | KEYED,
    ("post", "/v1/jobs/{job_id}/signals/{name}"): {200, 400, 404, 409, 410} | PARSED_BODY | KEYED,
    ("get", "/v1/pipelines/{name}/runs"): {200, 400} | KEYED,
    ("get", "/v1/jobs/{job_id}/diff"): {200, 400, 404, 409, 410} | KEYED,
    ("get", "/v1/pipelines"): {200, 400} | KEYED,
    ("post", "/v1/pipelines/import"): {200, 201, 404, 409, 415, 502, 504} | PARSED_BODY | KEYED,
    ("put", "/v1/pipelines/{name}"): {200, 201, 400, 409, 415} | BODY | KEYED,
    ("get", "/v1/pipelines/{name}"): {200, 400, 404, 422} | KEYED,
    ("delete", "/v1/pipelines/{name}"): {200, 400, 404, 409, 422} | KEYED,
    ("get", "/v1/pipelines/{name}/versions"): {200, 400, 404, 422} | KEYED,
    ("put", "/v1/pipelines/{name}/shares/{grantee}"): {200, 400, 404, 409, 422} | KEYED,
    ("delete", "/v1/pipelines/{name}/shares/{grantee}"): {200, 400, 404, 409, 422} | KEYED,
    ("put", "/v1/pipelines/{name}/schedule"): {200, 400, 404, 409} | PARSED_BODY | KEYED,
    ("get", "/v1/pipelines/{name}/schedule"): {200, 400, 404, 409} | KEYED,
    ("delete", "/v1/pipelines/{name}/schedule"): {204, 400, 404, 409} | KEYED,
    ("post", "/v1/pipelines/{name}/schedules"): {201, 400, 404, 409} | PARSED_BODY | KEYED,
    ("get", "/v1/pipelines/{name}/schedules"): {200, 400} | KEYED,
    ("get", "/v1/pipelines/{name}/schedules/{schedule}"): {200, 400, 404} | KEYED,
    ("put", "/v1/pipelines/{name}/schedules/{schedule}"): {200, 201, 400, 404, 409}
    | PARSED_BODY
    | KEYED,
    ("delete", "/v1/pipelines/{name}/schedules/{schedule}"): {204, 400, 404} | KEYED,
    ("get", "/v1/schedules"): {200} | KEYED,
    ("post", f"{BACKFILL}"): {201, 400, 404} | PARSED_BODY | KEYED,
    ("get", f"{BACKFILL}"): {200, 400, 404} | KEYED,
    ("get", f"{BACKFILL}/{{backfill_id}}"): {200, 400, 404} | KEYED,
    ("post", f"{BACKFILL}/{{backfill_id}}/cancel"): {200, 400, 404, 409} | KEYED,
    ("get", "/v1/pipelines/{name}/backfills"): {200, 400} | KEYED,
    ("put", "/v1/hooks/{name}"): {200, 201, 400, 404} | PARSED_BODY | KEYED,
    ("get", "/v1/hooks"): {200} | KEYED,
    ("get", "/v1/hooks/{name}"): {200, 400, 404} | KEYED,
    ("delete", "/v1/hooks/{name}"): {204, 400, 404} | KEYED,
    ("post", "/v1/hooks/{name}"): {200, 202, 400, 401, 404, 409, 429, 503} | BODY,
    ("put", "/v1/alerts/{name}"): {200, 201, 400, 409} | PARSED_BODY | KEYED,
    ("get", "/v1/alerts"): {200} | KEYED,
    ("get", "/v1/alerts/{name}"): {200, 400, 404} | KEYED,
    ("delete", "/v1/alerts/{name}"): {204, 400, 404, 409} | KEYED,
    ("get", "/v1/alerts/{name}/deliveries"): {200, 400, 404} | KEYED,
}
"""Every status each operation can answer, read from its route, the services it calls and
what surrounds it (key, rate limit, body cap, parameter validation: a path or query parameter
can always hold a NUL); nothing more."""


def test_each_operation_documents_exactly_the_statuses_it_can_answer(
    document: dict[str, Any],
) -> None:
    documented = {
        (method, path): {int(status) for status in operation["responses"]}
        for path, method, operation in _operations(document)
    }
    assert set(documented) == set(ANSWERS)
    wrong = {
        operation: {
            "extra": sorted(found - ANSWERS[operation]),
            "missing": sorted(ANSWERS[operation] - found),
        }
        for operation, found in documented.items()
        if found != ANSWERS[operation]
    }
    assert wrong == {}


def test_every_code_an_error_names_is_answered_with_that_status(
    document: dict[str, Any],
) -> None:
    for path, method, operation in _operations(document):
        for status, response in operation["responses"].items():
            if not status.startswith(("4", "5")) or path == "/health":
                continue
            named = re.split(r"[:;]", response["description"])[0]
            codes = [code.strip() for code in named.split(",")]
            assert codes, (method, path, status)
            for code in codes:
                assert STATUS_BY_CODE.get(code) == int(status), (method, path, status, code)


def test_every_429_says_when_to_come_back(document: dict[str, Any]) -> None:
    for path, method, operation in _operations(document):
        too_many = operation["responses"].get("429")
        if too_many is not None:
            assert too_many["headers"]["Retry-After"]["schema"]["type"] == "integer"
            assert "rate_limited" in too_many["description"], (method, path)
    created = document["paths"]["/v1/jobs"]["post"]["responses"]["429"]["description"]
    assert "open_jobs_limit" in created


def test_metrics_are_documented_as_prometheus_text(document: dict[str, Any]) -> None:
    answer = document["paths"]["/metrics"]["get"]["responses"]["200"]
    assert set(answer["content"]) == {"text/plain"}


def test_every_error_status_is_the_envelope(document: dict[str, Any]) -> None:
    for path, method, operation in _operations(document):
        if path == "/health":
            continue
        responses = operation["responses"]
        for status, response in responses.items():
            if status.startswith(("4", "5")):
                assert _is_envelope(response), (method, path, status)


def test_the_pipeline_put_takes_yaml_or_json(document: dict[str, Any]) -> None:
    body = document["paths"]["/v1/pipelines/{name}"]["put"]["requestBody"]
    assert body["required"] is True
    assert {"application/yaml", "text/yaml", "application/json"} <= set(body["content"])


def test_every_documented_401_is_what_a_call_without_a_key_answers(
    document: dict[str, Any], client: TestClient
) -> None:
    for path, method, _ in _operations(document):
        if path == "/health" or (path, method) in SIGNED:
            continue
        url = re.sub(r"\{[^}]+\}", "x0", path)
        answer = client.request(method.upper(), url)
        assert answer.status_code == 401, (method, path, answer.status_code)
        assert answer.json()["error"]["code"] == "unauthorized"


@pytest.fixture
def one_request_per_key(settings: Settings, runtime: Runtime) -> Iterator[TestClient]:
    strict = settings.model_copy(update={"rate_limit_per_s": 0.01, "rate_limit_burst": 1})
    with api_client(strict, runtime) as client:
        yield client


def test_every_operation_behind_a_key_answers_the_documented_429(
    document: dict[str, Any], one_request_per_key: TestClient, make_key: KeyFactory
) -> None:
    """The key's one request goes to a cheap route first, so a stream is never opened."""
    for path, method, operation in _operations(document):
        if path == "/health" or (path, method) in SIGNED:
            continue
        headers = {"Authorization": f"Bearer {make_key('admin')}"}
        assert one_request_per_key.get("/v1/schedules", headers=headers).status_code == 200
        url = re.sub(r"\{[^}]+\}", "x0", path)
        answer = one_request_per_key.request(method.upper(), url, headers=headers)
        assert answer.status_code == 429, (method, path, answer.status_code)
        assert answer.json()["error"]["code"] == "rate_limited"
        assert int(answer.headers["Retry-After"]) >= 1
        assert "429" in operation["responses"], (method, path)
