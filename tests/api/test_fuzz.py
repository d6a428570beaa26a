"""Schemathesis against the live OpenAPI document: every documented operation, with bodies,
paths and queries generated from its schema (valid and invalid), sent with no key, a read key
and an admin key. No answer is a 500, every error is the envelope with a code the route
documents, and a refused request leaves every table as it was.

The streaming routes are left out: a generated request to them is a stream that follows live.
"""

import re
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import status_code_conformance
from sqlalchemy import text

from service.engine.runtime import Runtime
from service.platform.auth import create_api_key
from service.platform.db import unit_of_work
from service.platform.settings import Settings
from tests.api.conftest import MAX_BODY
from tests.support.apps import api_client

EXAMPLES_PER_OPERATION = 20
STREAMS = r"/events$"
SYNC_WAIT_S = 0.05
GROUPS = ("/v1/jobs", "/v1/pipelines", "")
TABLES = (
    "api_keys",
    "jobs",
    "step_runs",
    "result_items",
    "approvals",
    "pipelines",
    "pipeline_versions",
    "schedules",
    "hooks",
    "hook_deliveries",
    "pipeline_triggers",
)
FINGERPRINT = text(
    " UNION ALL ".join(
        f"SELECT '{table}', count(*), coalesce(max(xmin::text::bigint), 0) FROM {table}"
        for table in TABLES
    )
)


@pytest.fixture(scope="module")
def fuzzed(settings: Settings, runtime: Runtime) -> Any:
    with api_client(settings, runtime) as client:
        yield client


@pytest.fixture(scope="module")
def api_schema(fuzzed: TestClient) -> Any:
    return schemathesis.openapi.from_asgi("/openapi.json", fuzzed.app).exclude(path_regex=STREAMS)


@pytest.fixture(scope="module")
def keys(runtime: Runtime) -> dict[str, dict[str, str]]:
    def bearer(scope: str) -> dict[str, str]:
        with unit_of_work(runtime.sessions) as session:
            token, _ = create_api_key(session, owner=f"fuzz-{scope}", scopes=[scope])
        return {"Authorization": f"Bearer {token}"}

    return {"none": {}, "read": bearer("read"), "admin": bearer("admin")}


def _fingerprint(runtime: Runtime) -> list[Any]:
    with runtime.sessions() as session:
        return [tuple(row) for row in session.execute(FINGERPRINT)]


def _bounded(case: Any) -> None:
    """A sync job request waits for its job; here nothing runs it, so it waits only briefly."""
    if isinstance(case.body, dict) and case.body.get("mode") == "sync":
        case.body["wait_s"] = SYNC_WAIT_S


def _is_envelope(body: Any) -> bool:
    error = body.get("error") if isinstance(body, dict) else None
    return (
        isinstance(error, dict)
        and isinstance(error.get("code"), str)
        and bool(error["code"])
        and isinstance(error.get("message"), str)
    )


def _covers(group: str, path: str) -> bool:
    return path.startswith(group) if group else not path.startswith(GROUPS[:-1])


@pytest.mark.parametrize("group", GROUPS)
def test_no_request_in_any_auth_state_gets_a_500_or_leaves_anything_behind(
    group: str, api_schema: Any, keys: dict[str, dict[str, str]], runtime: Runtime
) -> None:
    operations = [result.ok() for result in api_schema.get_all_operations()]
    chosen = [operation for operation in operations if _covers(group, operation.path)]
    assert chosen
    for operation in chosen:
        _fuzz(operation, keys, runtime)


def _cases(operation: Any) -> st.SearchStrategy[Any]:
    """Requests that fit the schema and requests that break it, half and half."""
    return st.one_of(
        operation.as_strategy(GenerationMode.POSITIVE),
        operation.as_strategy(GenerationMode.NEGATIVE),
    )


def _fuzz(operation: Any, keys: dict[str, dict[str, str]], runtime: Runtime) -> None:
    @given(case=_cases(operation))
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    def exchange(case: Any) -> None:
        _bounded(case)
        for headers in keys.values():
            before = _fingerprint(runtime)
            response = case.call(headers=headers)
            case.validate_response(response, checks=[not_a_server_error, status_code_conformance])
            if response.status_code >= 400:
                assert _is_envelope(response.json()), (response.status_code, response.text)
                assert _fingerprint(runtime) == before, (case.method, case.path, response.text)

    exchange()


def test_every_body_past_the_cap_is_refused_before_it_is_read(
    fuzzed: TestClient, api_schema: Any, keys: dict[str, dict[str, str]], runtime: Runtime
) -> None:
    oversized = b"{" + b" " * (MAX_BODY + 1) + b"}"
    operations = [result.ok() for result in api_schema.get_all_operations()]
    with_bodies = [operation for operation in operations if operation.body]
    assert len(with_bodies) >= 5
    for operation in with_bodies:
        path = re.sub(r"\{[^}]+\}", "x", operation.path)
        for headers in keys.values():
            before = _fingerprint(runtime)
            response = fuzzed.request(
                operation.method.upper(),
                path,
                content=oversized,
                headers={**headers, "Content-Type": "application/json"},
            )
            assert response.status_code == 413, (operation.method, path, response.text)
            assert response.json()["error"]["code"] == "payload_too_large"
            assert _fingerprint(runtime) == before
