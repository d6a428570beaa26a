"""Job intake has one contract, whichever way a submission is answered.

``POST /v1/jobs`` can be answered three ways: by the lane in front of FastAPI
(``api.lane.SubmitLane``), by the route accepting on the event loop through the coalescer
(``api.submit.accept_job_on_loop`` and ``api.batching.Coalescer``), or by the route accepting
in the thread pool (``api.submit.accept_job``). For each request of the table below, every way
gives the same status, the same body (ids and times aside) and the same stored rows.

How each way is driven: the lane answers a request without a query string by a key it holds;
a query string sends the request to the route; the route takes the thread's way when the app
has no ``loop_io``. Each way runs with an owner of its own, whose pipeline name is already
resolved (as it is for a client that has submitted before), so the coalescer is not skipped.
"""

import json
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from fastapi import Request
from fastapi.testclient import TestClient
from sqlalchemy import text

from api.deps import get_runtime
from service.catalogue.resolution import resolve_pipeline
from service.engine.runtime import Runtime
from service.platform.auth import create_api_key
from service.platform.db import unit_of_work
from service.platform.settings import Settings
from tests.api.conftest import MAX_BODY
from tests.support.apps import api_client

PATHS = ("lane", "batching", "plain")
BURST = 6
"""Requests a key may send in the window; each way sends the same ones, so the same one is
refused."""
OPEN_JOBS = 2

GREET = {"pipeline": "greet", "params": {"who": "ada"}}
INLINE = {
    "pipeline": {"name": "inline-greet", "steps": [{"id": "only", "action": "noop"}]},
    "params": {},
}
TENANT = {"pipeline": "tenants", "params": {"tenant": "acme"}}
SEARCH = {"pipeline": "search", "params": {"query": "crispr"}}
SEARCH_ONCE = {"pipeline": "search-once", "params": {"query": "crispr"}}


@dataclass(frozen=True)
class Case:
    name: str
    body: Any
    status: int
    code: str | None = None
    before: list[Any] = field(default_factory=list)
    """Requests the same key sends first, through the same way."""
    scopes: tuple[str, ...] = ("write",)
    content_type: str = "application/json"
    authorized: bool = True
    coalesced: bool = False
    """The lane and the batching way are expected to take it through the coalescer."""


def _keyed(key: str, **params: Any) -> dict[str, Any]:
    return {**GREET, "params": {"who": "ada", **params}, "idempotency_key": key}


def _query(query: str) -> dict[str, Any]:
    return {**SEARCH, "params": {"query": query}}


CASES = [
    Case("valid named pipeline", GREET, 202, coalesced=True),
    Case("keyed job with a free slot", TENANT, 202, coalesced=True),
    Case("keyed job over its limit", TENANT, 202, before=[TENANT], coalesced=True),
    Case("valid inline profile", INLINE, 202),
    Case("idempotent replay", _keyed("k1"), 200, before=[_keyed("k1")]),
    Case(
        "idempotency key reused for another request",
        _keyed("k1", count=2),
        409,
        "idempotency_conflict",
        before=[_keyed("k1")],
    ),
    Case("unknown pipeline", {"pipeline": "no-such-pipeline"}, 404, "pipeline_not_found"),
    Case("missing param", {"pipeline": "greet", "params": {}}, 422, "params_invalid"),
    Case(
        "param of the wrong type",
        {"pipeline": "greet", "params": {"who": "a", "count": "2"}},
        422,
        "params_invalid",
    ),
    Case("unknown field", {**GREET, "bogus": 1}, 422, "validation_error"),
    Case("JSON that does not parse", b'{"pipeline": ', 422, "validation_error"),
    Case(
        "inline profile with an unknown action",
        {"pipeline": {"name": "bad", "steps": [{"id": "a", "action": "no.such"}]}},
        422,
        "profile_invalid",
    ),
    Case(
        "oversize body",
        {"pipeline": "greet", "params": {"who": "x" * MAX_BODY}},
        413,
        "payload_too_large",
    ),
    Case("wrong content type", GREET, 422, "validation_error", content_type="text/plain"),
    Case("no key", GREET, 401, "unauthorized", authorized=False),
    Case("read-only key", GREET, 403, "forbidden", scopes=("read",)),
    Case(
        "open jobs limit reached",
        _keyed("k3"),
        429,
        "open_jobs_limit",
        before=[_keyed("k1"), _keyed("k2")],
    ),
    Case(
        "idempotent replay at the open jobs limit",
        _keyed("k2"),
        200,
        before=[_keyed("k1"), _keyed("k2")],
    ),
    Case("another dedupe key", SEARCH, 202, before=[_query("prime")], coalesced=True),
    Case("duplicate of an open job", SEARCH, 200, before=[SEARCH], coalesced=True),
    Case(
        "duplicate refused", SEARCH_ONCE, 409, "duplicate_job", before=[SEARCH_ONCE], coalesced=True
    ),
    Case(
        "duplicate at the open jobs limit",
        SEARCH,
        200,
        before=[SEARCH, _query("prime")],
        coalesced=True,
    ),
    Case(
        "rate limited",
        _keyed("k1"),
        429,
        "rate_limited",
        # The first request of the way (the read that puts the key in the cache) and these
        # fill the burst; replays, so the open-jobs limit is not what refuses.
        before=[_keyed("k1")] * (BURST - 1),
    ),
]


@dataclass
class Taken:
    """What answered: the route (its dependencies ran) and how many jobs the coalescer took."""

    route: int = 0
    coalesced: int = 0


@pytest.fixture(scope="module")
def contract_client(settings: Settings, runtime: Runtime) -> Iterator[TestClient]:
    strict = settings.model_copy(
        update={
            "rate_limit_per_s": BURST / 3600,
            "rate_limit_burst": BURST,
            "max_open_jobs_per_owner": OPEN_JOBS,
        }
    )
    with api_client(strict, runtime) as client:
        yield client


@pytest.fixture
def taken(contract_client: TestClient, monkeypatch: pytest.MonkeyPatch) -> Taken:
    record = Taken()
    app: Any = contract_client.app

    def recording(request: Request) -> Runtime:
        if request.method == "POST":
            record.route += 1
        runtime: Runtime = request.app.state.runtime
        return runtime

    monkeypatch.setitem(app.dependency_overrides, get_runtime, recording)
    jobs = app.state.loop_io.jobs
    submit = jobs.submit

    async def counting(item: Any) -> Any:
        record.coalesced += 1
        return await submit(item)

    monkeypatch.setattr(jobs, "submit", counting)
    return record


UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:?\d{2})?$")


class Normalizer:
    """Ids become ``<id1>``, ``<id2>``... in the order first seen (so a replay still shows the
    same job), times ``<time>``, the way's owner ``<owner>``."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.ids: dict[str, str] = {}

    def __call__(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {key: self(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self(item) for item in value]
        if isinstance(value, str):
            if TIME.match(value):
                return "<time>"
            value = value.replace(self.owner, "<owner>")
            return UUID.sub(self._id, value)
        return value

    def _id(self, match: re.Match[str]) -> str:
        return self.ids.setdefault(match.group(0), f"<id{len(self.ids) + 1}>")


def _answer(response: Any) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = response.text
    return {
        "status": response.status_code,
        "content_type": response.headers.get("content-type"),
        "retry_after": "retry-after" in response.headers,
        "body": body,
    }


STORED = {
    "jobs": "SELECT to_jsonb(j) AS row FROM jobs j WHERE j.owner = :owner ORDER BY j.created_at",
    "step_runs": (
        "SELECT to_jsonb(s) - 'id' AS row FROM step_runs s JOIN jobs j ON j.id = s.job_id"
        " WHERE j.owner = :owner ORDER BY j.created_at, s.step_id, s.shard"
    ),
    "job_events": (
        "SELECT to_jsonb(e) - 'id' AS row FROM job_events e JOIN jobs j ON j.id = e.job_id"
        " WHERE j.owner = :owner ORDER BY j.created_at, e.seq, e.kind"
    ),
}


def _stored(runtime: Runtime, owner: str) -> dict[str, list[Any]]:
    with runtime.sessions() as session:
        return {
            table: [row for (row,) in session.execute(text(query), {"owner": owner})]
            for table, query in STORED.items()
        }


def _submit(client: TestClient, way: str, case: Case, headers: dict[str, str], body: Any) -> Any:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    url = "/v1/jobs" if way == "lane" else "/v1/jobs?via=route"
    return client.post(url, content=raw, headers={"Content-Type": case.content_type, **headers})


def _run(client: TestClient, runtime: Runtime, way: str, case: Case) -> dict[str, Any]:
    owner = f"contract-{way}-{uuid.uuid4().hex[:8]}"
    app: Any = client.app
    with unit_of_work(runtime.sessions) as session:
        token, _ = create_api_key(session, owner=owner, scopes=case.scopes)
        for name in ("greet", "tenants", "search", "search-once"):
            resolve_pipeline(
                session,
                name,
                owner=owner,
                profiles_dir=app.state.settings.profiles_dir,
                known_actions=runtime.registry.names(),
            )
    headers = {"Authorization": f"Bearer {token}"} if case.authorized else {}
    if case.authorized:  # the key is then one the API holds, as a returning client's is
        assert client.get("/v1/jobs", headers=headers).status_code in (200, 403)
    io = app.state.loop_io
    if way == "plain":
        app.state.loop_io = None
    try:
        answers = [_submit(client, way, case, headers, body) for body in [*case.before, case.body]]
    finally:
        app.state.loop_io = io
    normal = Normalizer(owner)
    return {
        "answers": normal([_answer(answer) for answer in answers]),
        "stored": normal(_stored(runtime, owner)),
    }


EXPECTED_WAY: dict[str, Callable[[Taken, int], bool]] = {
    "lane": lambda t, n: t.route == 0 and t.coalesced == n,
    "batching": lambda t, n: t.route == n and t.coalesced == n,
    "plain": lambda t, n: t.route == n and t.coalesced == 0,
}


@pytest.mark.parametrize("case", [pytest.param(case, id=case.name) for case in CASES])
def test_every_way_of_taking_a_job_gives_the_same_answer_and_rows(
    contract_client: TestClient, runtime: Runtime, taken: Taken, case: Case
) -> None:
    outcomes: dict[str, dict[str, Any]] = {}
    for way in PATHS:
        taken.route = taken.coalesced = 0
        outcomes[way] = _run(contract_client, runtime, way, case)
        if case.coalesced:
            assert EXPECTED_WAY[way](taken, len(case.before) + 1), (way, taken)
    lane = outcomes["lane"]
    final = lane["answers"][-1]
    assert final["status"] == case.status, final
    if case.code is not None:
        assert final["body"]["error"]["code"] == case.code, final
    accepted = [answer for answer in lane["answers"] if answer["status"] == 202]
    assert len(lane["stored"]["jobs"]) == len(accepted), "a refusal stored nothing"
    for way in PATHS[1:]:
        assert outcomes[way]["answers"] == lane["answers"], way
        assert outcomes[way]["stored"] == lane["stored"], way
