"""The lane in front of FastAPI answers the common submission as the route does, and hands every
other request to the route with its body intact, so the route's answer is the one given."""

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from fastapi import Request
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY

from api.deps import get_runtime
from service.engine.runtime import Runtime
from service.platform.settings import Settings
from tests.api.conftest import MAX_BODY, KeyFactory
from tests.support.apps import api_client

Headers = dict[str, str]
QUEUE = "flowbeat.steps"
GREET_JOB = {"pipeline": "greet", "params": {"who": "ada"}}


@pytest.fixture
def route_calls(client: TestClient) -> Iterator[list[str]]:
    """The paths of the requests that reached a route depending on the runtime (the jobs route
    does), which then runs as before."""
    calls: list[str] = []

    def recording(request: Request) -> Runtime:
        calls.append(f"{request.method} {request.url.path}")
        runtime: Runtime = request.app.state.runtime
        return runtime

    app: Any = client.app
    app.dependency_overrides[get_runtime] = recording
    try:
        yield calls
    finally:
        app.dependency_overrides.clear()


def known_key(client: TestClient, make_key: KeyFactory, *scopes: str) -> Headers:
    """A key the API has authenticated once, and so holds in its cache."""
    headers = {"Authorization": f"Bearer {make_key(*scopes)}"}
    assert client.get("/v1/jobs", headers=headers).status_code in (200, 403)
    return headers


def post(client: TestClient, headers: Headers, body: Any, **kwargs: Any) -> Any:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **headers}
    return client.post("/v1/jobs", content=raw, headers=headers, **kwargs)


def _count(route: str, status_class: str) -> float:
    labels = {"route": route, "method": "POST", "status": status_class}
    return REGISTRY.get_sample_value("flowbeat_api_request_duration_seconds_count", labels) or 0.0


def test_a_submission_by_a_known_key_is_answered_in_front_of_the_route(
    client: TestClient,
    make_key: KeyFactory,
    route_calls: list[str],
    broker: redis.Redis,
) -> None:
    writer = known_key(client, make_key, "write")
    queued, counted = broker.llen(QUEUE), _count("/v1/jobs", "2xx")
    answer = post(client, writer, GREET_JOB)
    assert answer.status_code == 202, answer.text
    assert answer.headers["content-type"] == "application/json"
    job = answer.json()["job"]
    assert job["status"] == "queued" and job["params"] == {"who": "ada", "count": 1}
    assert "POST /v1/jobs" not in route_calls
    assert broker.llen(QUEUE) == queued + 1
    assert _count("/v1/jobs", "2xx") == counted + 1
    read = client.get(f"/v1/jobs/{job['id']}", headers=writer).json()["job"]
    assert read["id"] == job["id"] and read["pipeline"] == "greet"


def test_the_lanes_connections_plan_the_intake_once(
    client: TestClient, make_key: KeyFactory
) -> None:
    answer = post(client, known_key(client, make_key, "write"), GREET_JOB)
    assert answer.status_code == 202, answer.text

    async def setting() -> str:
        async with client.app.state.loop_io.pool.connection() as conn:  # type: ignore[attr-defined]
            cursor = await conn.execute("SHOW plan_cache_mode")
            row = await cursor.fetchone()
            return str(row[0])

    assert client.portal.call(setting) == "force_generic_plan"  # type: ignore[union-attr]


def test_its_answer_is_the_routes_answer(
    client: TestClient, make_key: KeyFactory, route_calls: list[str]
) -> None:
    writer = known_key(client, make_key, "write")
    by_lane = post(client, writer, {**GREET_JOB, "idempotency_key": "same"})
    by_route = post(client, writer, {**GREET_JOB, "idempotency_key": "same"}, params={"via": "x"})
    assert [call for call in route_calls if call.startswith("POST")] == ["POST /v1/jobs"]
    assert (by_lane.status_code, by_route.status_code) == (202, 200)
    assert by_route.json() == by_lane.json()


def test_a_refusal_in_the_lane_is_the_error_the_route_gives(
    client: TestClient, make_key: KeyFactory, route_calls: list[str]
) -> None:
    writer = known_key(client, make_key, "write")
    answer = post(client, writer, {"pipeline": "no-such-pipeline"})
    assert answer.status_code == 404, answer.text
    assert answer.json()["error"]["code"] == "pipeline_not_found"
    assert "POST /v1/jobs" not in route_calls


HANDED_ON: list[tuple[str, dict[str, Any], Callable[[Any], None]]] = [
    (
        "a body the model refuses, named by the route",
        {"body": {**GREET_JOB, "bogus": 1}},
        lambda a: _is(a, 422, "validation_error", "bogus"),
    ),
    (
        "JSON that does not parse",
        {"body": b'{"pipeline": '},
        lambda a: _is(a, 422, "validation_error", ""),
    ),
    (
        "a request that waits for its job, with the body it sent",
        {"body": {**GREET_JOB, "mode": "sync", "wait_s": 0.2}},
        lambda a: _is(a, 202, None, ""),
    ),
    (
        "a query string",
        {"body": GREET_JOB, "params": {"x": "1"}},
        lambda a: _is(a, 202, None, ""),
    ),
    (
        "a body that is not sent as JSON",
        {"body": json.dumps(GREET_JOB).encode(), "headers": {"Content-Type": "text/plain"}},
        lambda a: _is(a, 422, "validation_error", "Content-Type: application/json"),
    ),
    (
        "a body over the cap",
        {"body": {**GREET_JOB, "params": {"who": "x" * MAX_BODY}}},
        lambda a: _is(a, 413, "payload_too_large", ""),
    ),
]


def _is(answer: Any, status: int, code: str | None, said: str) -> None:
    assert answer.status_code == status, answer.text
    if code is not None:
        error = answer.json()["error"]
        assert error["code"] == code and said in error["message"], error


@pytest.mark.parametrize(
    ("request_kwargs", "expect"),
    [pytest.param(kwargs, expect, id=name) for name, kwargs, expect in HANDED_ON],
)
def test_any_other_submission_reaches_the_route_with_its_body(
    client: TestClient,
    make_key: KeyFactory,
    route_calls: list[str],
    request_kwargs: dict[str, Any],
    expect: Callable[[Any], None],
) -> None:
    """An error the lane never gives shows that the route answered; an accepted job shows it by
    the route's dependencies having run."""
    writer = known_key(client, make_key, "write")
    kwargs = dict(request_kwargs)
    headers = {**writer, **kwargs.pop("headers", {})}
    answer = post(client, headers, kwargs.pop("body"), **kwargs)
    expect(answer)
    if answer.status_code < 300:
        assert route_calls.count("POST /v1/jobs") == 1


def test_a_key_without_the_write_scope_is_refused_by_the_route(
    client: TestClient, make_key: KeyFactory, route_calls: list[str]
) -> None:
    reader = known_key(client, make_key, "read")
    answer = post(client, reader, GREET_JOB)
    assert answer.status_code == 403 and answer.json()["error"]["code"] == "forbidden"


def test_a_rate_limited_key_gets_429_with_retry_after(
    settings: Settings, runtime: Runtime, make_key: KeyFactory
) -> None:
    strict = settings.model_copy(update={"rate_limit_per_s": 1 / 3600, "rate_limit_burst": 2})
    # A token an hour: however slowly a loaded machine sends them, none comes back between.
    with api_client(strict, runtime) as client:
        writer = known_key(client, make_key, "write")
        answers = [post(client, writer, GREET_JOB) for _ in range(2)]
    assert [a.status_code for a in answers] == [202, 429]
    assert answers[1].json()["error"]["code"] == "rate_limited"
    assert int(answers[1].headers["Retry-After"]) >= 1
