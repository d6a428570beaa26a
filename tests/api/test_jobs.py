import asyncio
import io
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
import redis
from fastapi.testclient import TestClient

from service.engine.intake import NewJob, insert_jobs_if_resolved, new_job
from service.engine.runtime import Runtime
from service.platform import logs
from service.platform.constants import (
    BROKER_PUBLISH_RETRIES,
    BROKER_PUSH_TIMEOUT_S,
    RATE_LIMIT_REDIS_TIMEOUT_S,
)
from service.platform.db import unit_of_work
from service.platform.models import JobRow
from service.platform.settings import Settings
from tests.api.conftest import GREET, MAX_BODY, KeyFactory
from tests.support.apps import api_client
from tests.support.arrange import walk
from tests.support.tcpproxy import TcpProxy

Headers = dict[str, str]
QUEUE = "flowbeat.steps"


def _error(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == code and error["message"] and isinstance(error["details"], dict)
    return error


def _submit(client: TestClient, headers: Headers, **body: Any) -> Any:
    body.setdefault("pipeline", "greet")
    body.setdefault("params", {"who": "ada"})
    return client.post("/v1/jobs", json=body, headers=headers)


def test_submit_stores_and_publishes(
    client: TestClient, writer: Headers, broker: redis.Redis
) -> None:
    before = broker.llen(QUEUE)
    response = _submit(client, writer)
    assert response.status_code == 202, response.text
    job = response.json()["job"]
    assert job["status"] == "queued" and job["pipeline"] == "greet"
    assert job["params"] == {"who": "ada", "count": 1} and job["trigger"] == "api"
    assert job["created_at"].endswith("+00:00")
    assert [s["step_id"] for s in job["steps"]] == ["first", "second"]
    assert broker.llen(QUEUE) == before + 1
    got = client.get(f"/v1/jobs/{job['id']}", headers=writer)
    assert got.status_code == 200 and got.json()["job"]["id"] == job["id"]


def test_idempotency(client: TestClient, writer: Headers, broker: redis.Redis) -> None:
    first = _submit(client, writer, idempotency_key="k-1")
    assert first.status_code == 202
    published = broker.llen(QUEUE)
    again = _submit(client, writer, idempotency_key="k-1")
    assert again.status_code == 200 and again.json()["job"]["id"] == first.json()["job"]["id"]
    assert broker.llen(QUEUE) == published
    other = _submit(client, writer, idempotency_key="k-1", params={"who": "bob"})
    _error(other, 409, "idempotency_conflict")
    elsewhere = _submit(client, writer, idempotency_key="k-1", notify_url="https://h.example/x")
    _error(elsewhere, 409, "idempotency_conflict")


def test_a_duplicate_gets_the_open_job_back_or_is_refused_naming_it(
    client: TestClient, writer: Headers, broker: redis.Redis
) -> None:
    query = {"query": f"crispr-{uuid.uuid4().hex[:6]}"}
    first = _submit(client, writer, pipeline="search", params=query)
    assert first.status_code == 202 and first.json()["deduplicated"] is False
    assert first.json()["job"]["dedupe_key"] == query["query"]
    published = broker.llen(QUEUE)
    again = _submit(client, writer, pipeline="search", params=query)
    assert again.status_code == 200, again.text
    assert again.json()["deduplicated"] is True
    assert again.json()["job"]["id"] == first.json()["job"]["id"]
    assert broker.llen(QUEUE) == published

    strict = _submit(client, writer, pipeline="search-once", params=query)
    assert strict.status_code == 202
    refused = _error(
        _submit(client, writer, pipeline="search-once", params=query), 409, "duplicate_job"
    )
    assert refused["details"]["job_id"] == strict.json()["job"]["id"]
    assert strict.json()["job"]["id"] in refused["message"]


def test_inline_profiles(client: TestClient, writer: Headers) -> None:
    inline = {"name": "inline-one", "steps": [{"id": "only", "action": "noop"}]}
    response = client.post("/v1/jobs", json={"pipeline": inline}, headers=writer)
    assert response.status_code == 202 and response.json()["job"]["pipeline"] == "inline-one"
    response = client.post(
        "/v1/jobs", json={"pipeline": GREET, "params": {"who": "x"}}, headers=writer
    )
    assert response.status_code == 202 and response.json()["job"]["pipeline"] == "greet"


def _inline(steps: list[dict[str, Any]]) -> dict[str, Any]:
    return {"name": "bad", "steps": steps}


BAD_BODIES: list[tuple[str, Any, int, str]] = [
    ("unknown pipeline", {"pipeline": "nope"}, 404, "pipeline_not_found"),
    ("bad yaml", {"pipeline": "name: x\nsteps: [\n  - {id: a"}, 422, "profile_invalid"),
    ("bad json text", {"pipeline": '{"name": "x", "steps": [}'}, 422, "profile_invalid"),
    (
        "unknown action",
        {"pipeline": _inline([{"id": "a", "action": "no.such"}])},
        422,
        "profile_invalid",
    ),
    (
        "cycle",
        {
            "pipeline": _inline(
                [
                    {"id": "a", "action": "noop", "depends_on": ["b"]},
                    {"id": "b", "action": "noop", "depends_on": ["a"]},
                ]
            )
        },
        422,
        "profile_invalid",
    ),
    ("missing param", {"pipeline": "greet", "params": {}}, 422, "params_invalid"),
    (
        "wrong type",
        {"pipeline": "greet", "params": {"who": "a", "count": "2"}},
        422,
        "params_invalid",
    ),
    ("unknown param", {"pipeline": "greet", "params": {"who": "a", "x": 1}}, 422, "params_invalid"),
    ("extra field", {"pipeline": "greet", "params": {"who": "a"}, "x": 1}, 422, "validation_error"),
    ("no pipeline", {"params": {}}, 422, "validation_error"),
    (
        "empty idempotency key",
        {"pipeline": "greet", "idempotency_key": ""},
        422,
        "validation_error",
    ),
    ("body not an object", [1, 2], 422, "validation_error"),
]


@pytest.mark.parametrize(
    ("body", "status", "code"), [case[1:] for case in BAD_BODIES], ids=[c[0] for c in BAD_BODIES]
)
def test_bad_submissions_store_nothing(
    client: TestClient,
    writer: Headers,
    job_count: Callable[[], int],
    body: Any,
    status: int,
    code: str,
) -> None:
    before = job_count()
    _error(client.post("/v1/jobs", json=body, headers=writer), status, code)
    assert job_count() == before


def test_profile_errors_name_the_problem(client: TestClient, writer: Headers) -> None:
    bad = _inline([{"id": "a", "action": "no.such"}])
    error = _error(
        client.post("/v1/jobs", json={"pipeline": bad}, headers=writer), 422, "profile_invalid"
    )
    assert error["details"]["errors"][0]["code"] == "unknown_action"


def test_malformed_json_body(
    client: TestClient, writer: Headers, job_count: Callable[[], int]
) -> None:
    before = job_count()
    headers = {**writer, "Content-Type": "application/json"}
    response = client.post("/v1/jobs", content=b'{"pipeline": ', headers=headers)
    _error(response, 422, "validation_error")
    assert job_count() == before


def test_oversized_body(client: TestClient, writer: Headers, job_count: Callable[[], int]) -> None:
    before = job_count()
    body = {"pipeline": "greet", "params": {"who": "x" * (MAX_BODY + 10)}}
    error = _error(client.post("/v1/jobs", json=body, headers=writer), 413, "payload_too_large")
    assert error["details"]["limit"] == MAX_BODY
    assert job_count() == before


def test_oversized_chunked_body(
    client: TestClient, writer: Headers, job_count: Callable[[], int]
) -> None:
    before = job_count()
    payload = json.dumps({"pipeline": "greet", "params": {"who": "x" * (MAX_BODY * 2)}}).encode()

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(payload), 4096):
            yield payload[start : start + 4096]

    headers = {**writer, "Content-Type": "application/json"}
    response = client.post("/v1/jobs", content=chunks(), headers=headers)
    assert "content-length" not in {k.lower() for k in response.request.headers}
    _error(response, 413, "payload_too_large")
    assert job_count() == before


def test_list_paging_and_filters(client: TestClient, make_key: KeyFactory) -> None:
    headers = {"Authorization": f"Bearer {make_key('write')}"}
    ids = [_submit(client, headers).json()["job"]["id"] for _ in range(5)]
    inline = {"name": "other-pipe", "steps": [{"id": "only", "action": "noop"}]}
    assert client.post("/v1/jobs", json={"pipeline": inline}, headers=headers).status_code == 202
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"pipeline": "greet", "limit": 2}
        if cursor:
            params["cursor"] = cursor
        page = client.get("/v1/jobs", params=params, headers=headers)
        assert page.status_code == 200, page.text
        seen += [job["id"] for job in page.json()["jobs"]]
        cursor = page.json()["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))
    everything = client.get("/v1/jobs", headers=headers).json()["jobs"]
    assert len(everything) == 6
    client.post(f"/v1/jobs/{ids[0]}/cancel", headers=headers)
    for query in ("status=cancelled", "status=cancelled,failed", "status=cancelled&status=failed"):
        found = client.get(f"/v1/jobs?{query}", headers=headers).json()["jobs"]
        assert [job["id"] for job in found] == [ids[0]]
    queued = client.get("/v1/jobs?status=queued", headers=headers).json()["jobs"]
    assert len(queued) == 5


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ("cursor=!!!notacursor", "invalid_cursor"),
        ("cursor=Zm9v", "invalid_cursor"),
        ("limit=0", "invalid_query"),
        ("limit=100000", "invalid_query"),
        ("limit=ten", "invalid_query"),
        ("status=sleeping", "invalid_query"),
    ],
)
def test_bad_list_queries_are_400(
    client: TestClient, writer: Headers, query: str, code: str
) -> None:
    _error(client.get(f"/v1/jobs?{query}", headers=writer), 400, code)


def test_unknown_and_malformed_job_ids_are_404(client: TestClient, writer: Headers) -> None:
    for job_id in (str(uuid.uuid4()), "not-a-uuid"):
        _error(client.get(f"/v1/jobs/{job_id}", headers=writer), 404, "job_not_found")
        _error(client.post(f"/v1/jobs/{job_id}/cancel", headers=writer), 404, "job_not_found")


def test_cancel(client: TestClient, writer: Headers, runtime: Runtime) -> None:
    job_id = _submit(client, writer).json()["job"]["id"]
    response = client.post(f"/v1/jobs/{job_id}/cancel", headers=writer)
    assert response.status_code == 200, response.text
    job = response.json()["job"]
    assert job["status"] == "cancelled" and job["finished_at"]
    assert {step["status"] for step in job["steps"]} == {"cancelled"}
    again = client.post(f"/v1/jobs/{job_id}/cancel", headers=writer)
    assert again.status_code == 200
    done = _submit(client, writer).json()["job"]["id"]
    with unit_of_work(runtime.sessions) as session:
        walk(session, JobRow, JobRow.id == uuid.UUID(done), to="succeeded")
    _error(client.post(f"/v1/jobs/{done}/cancel", headers=writer), 409, "job_conflict")


def test_read_key_cannot_cancel(client: TestClient, writer: Headers, make_key: KeyFactory) -> None:
    job_id = _submit(client, writer).json()["job"]["id"]
    reader = {"Authorization": f"Bearer {make_key('read')}"}
    _error(client.post(f"/v1/jobs/{job_id}/cancel", headers=reader), 403, "forbidden")


def test_broker_down_keeps_the_job(
    broken_broker_client: TestClient, make_key: KeyFactory, job_count: Callable[[], int]
) -> None:
    headers = {"Authorization": f"Bearer {make_key('write')}"}
    before = job_count()
    error = _error(_submit(broken_broker_client, headers), 503, "broker_unavailable")
    assert error["details"]["job_id"]
    assert job_count() == before + 1


def test_a_job_of_a_name_seen_before_is_accepted_on_the_event_loop_alike(
    client: TestClient, writer: Headers, monkeypatch: pytest.MonkeyPatch, broker: redis.Redis
) -> None:
    first = _submit(client, writer)

    def in_the_thread(*_: object) -> None:
        raise AssertionError("accepted in the thread pool")

    monkeypatch.setattr("api.routes.jobs.accept_job", in_the_thread)
    second = _submit(client, writer)

    assert (first.status_code, second.status_code) == (202, 202)
    jobs = [answer.json()["job"] for answer in (first, second)]
    fresh = {"id", "created_at"}
    assert [{k: v for k, v in job.items() if k not in fresh} for job in jobs] == [
        {k: v for k, v in jobs[0].items() if k not in fresh}
    ] * 2
    queued = [json.loads(raw)["headers"]["argsrepr"] for raw in broker.lrange(QUEUE, 0, -1)]
    assert f"job={jobs[1]['id']} step=first" in queued


def test_a_batch_picked_to_break_a_deadlock_is_answered_from_the_thread_pool(
    client: TestClient,
    writer: Headers,
    monkeypatch: pytest.MonkeyPatch,
    job_count: Callable[[], int],
) -> None:
    _submit(client, writer)
    before = job_count()

    async def deadlocked(*_: object, **__: object) -> set[uuid.UUID]:
        raise psycopg.errors.DeadlockDetected("deadlock detected")

    monkeypatch.setattr("api.submit.insert_jobs_if_resolved", deadlocked)
    answer = _submit(client, writer)

    assert answer.status_code == 202, answer.text
    assert job_count() == before + 1


class HeldBatches:
    """Holds the event loop's first batch of jobs until ``together`` jobs have been made, so
    the others queue up behind it and go out together; records every batch's size."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, together: int) -> None:
        self.together = together
        self.made: list[uuid.UUID] = []
        self.sizes: list[int] = []
        monkeypatch.setattr("api.submit.new_job", self._counted)
        monkeypatch.setattr("api.submit.insert_jobs_if_resolved", self._held)

    def _counted(self, *args: Any, **kwargs: Any) -> NewJob:
        job = new_job(*args, **kwargs)
        self.made.append(job.id)
        return job

    async def _held(self, conn: Any, jobs: list[NewJob], *, open_jobs_limit: int) -> set[uuid.UUID]:
        self.sizes.append(len(jobs))
        deadline = time.monotonic() + 10
        while len(self.sizes) == 1 and len(self.made) < self.together:
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.01)
        return await insert_jobs_if_resolved(conn, jobs, open_jobs_limit=open_jobs_limit)


def test_jobs_that_arrive_together_are_stored_and_sent_together_and_answered_each(
    client: TestClient, writer: Headers, monkeypatch: pytest.MonkeyPatch, broker: redis.Redis
) -> None:
    together = 8
    assert _submit(client, writer).status_code == 202
    batches = HeldBatches(monkeypatch, together)
    with ThreadPoolExecutor(together) as pool:
        answers = list(pool.map(lambda _: _submit(client, writer), range(together)))

    assert [answer.status_code for answer in answers] == [202] * together
    ids = {answer.json()["job"]["id"] for answer in answers}
    assert ids == {str(job_id) for job_id in batches.made}
    assert sum(batches.sizes) == together and max(batches.sizes) > 1
    queued = [json.loads(raw)["headers"]["argsrepr"] for raw in broker.lrange(QUEUE, 0, -1)]
    assert all(f"job={job_id} step=first" in queued for job_id in ids)


def test_a_job_the_database_refuses_fails_alone_not_the_jobs_that_came_with_it(
    client: TestClient,
    writer: Headers,
    monkeypatch: pytest.MonkeyPatch,
    job_count: Callable[[], int],
) -> None:
    assert _submit(client, writer).status_code == 202
    whos = ["ada", "grace", "nul\x00", "alan"]
    batches = HeldBatches(monkeypatch, len(whos))
    before = job_count()
    with ThreadPoolExecutor(len(whos)) as pool:
        answers = list(pool.map(lambda who: _submit(client, writer, params={"who": who}), whos))

    assert max(batches.sizes) > 1
    assert [answer.status_code for answer in answers] == [202, 202, 422, 202]
    _error(answers[2], 422, "validation_error")
    assert job_count() == before + 3


def test_broker_down_on_the_event_loop_keeps_the_job_unsent(
    broken_broker_client: TestClient, make_key: KeyFactory, runtime: Runtime
) -> None:
    headers = {"Authorization": f"Bearer {make_key('write')}"}
    ids = [
        _error(_submit(broken_broker_client, headers), 503, "broker_unavailable")["details"][
            "job_id"
        ]
        for _ in range(2)
    ]

    with runtime.sessions() as session:
        rows = [session.get(JobRow, uuid.UUID(job_id)) for job_id in ids]
        assert [row is not None and row.dispatched_at is None for row in rows] == [True, True]


@pytest.mark.timeout(60)
def test_a_broker_that_stops_answering_is_unavailable_within_seconds(
    settings: Settings, runtime: Runtime, make_key: KeyFactory
) -> None:
    """A partition drops packets without closing a connection: the push gives up after its
    timeout and retries, the answer is 503 and the job is kept for the sweeper to send."""
    broker = urlsplit(settings.broker_url or "")
    with TcpProxy(broker.hostname or "", broker.port or 6379) as proxy:
        through = broker._replace(netloc=f"127.0.0.1:{proxy.port}").geturl()
        headers = {"Authorization": f"Bearer {make_key('write')}"}
        with api_client(settings.model_copy(update={"broker_url": through}), runtime) as client:
            assert _submit(client, headers).status_code == 202
            proxy.stall()
            started = time.monotonic()
            error = _error(_submit(client, headers), 503, "broker_unavailable")
            waited = time.monotonic() - started

    attempts = BROKER_PUBLISH_RETRIES + 1
    assert waited < attempts * (BROKER_PUSH_TIMEOUT_S + 1) + RATE_LIMIT_REDIS_TIMEOUT_S
    with runtime.sessions() as session:
        row = session.get(JobRow, uuid.UUID(error["details"]["job_id"]))
        assert row is not None and row.dispatched_at is None


def test_unknown_route_and_method(client: TestClient, writer: Headers) -> None:
    _error(client.get("/v1/nothing", headers=writer), 404, "not_found")
    _error(client.delete("/v1/jobs", headers=writer), 405, "method_not_allowed")


def test_the_submission_log_line_names_the_job(client: TestClient, make_key: KeyFactory) -> None:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    out = io.StringIO()
    logs.configure("json", "INFO", out)
    try:
        response = client.post(
            "/v1/jobs",
            json={"pipeline": "greet", "params": {"who": "ada"}},
            headers={"Authorization": f"Bearer {make_key('write')}"},
        )
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)

    job_id = response.json()["job"]["id"]
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    [submitted] = [line for line in lines if line["message"].startswith("job submitted")]
    assert submitted["job_id"] == job_id and submitted["logger"] == "api.submit"
