"""The OpenAPI document says what the API does: the bearer scheme where a key is needed, the
error envelope under the statuses routes answer with, and the pipeline PUT's YAML body."""

import re
from typing import Any

import pytest
from fastapi.testclient import TestClient

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


def test_every_error_status_is_the_envelope(document: dict[str, Any]) -> None:
    for path, method, operation in _operations(document):
        if path == "/health":
            continue
        responses = operation["responses"]
        needed = {"401", "403", "503"} | ({"413", "422"} if "requestBody" in operation else set())
        assert needed <= set(responses), (method, path, sorted(responses))
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
