"""Abuse limits: requests per key, open jobs per owner. Each refusal is a 429 that says when
to come back, and stores nothing."""

from collections.abc import Iterator

import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from service.engine.runtime import Runtime
from service.platform.constants import RATE_LIMIT_KEY_PREFIX
from service.platform.models import ApiKeyRow, JobRow
from service.platform.settings import Settings
from tests.api.conftest import CLOSED_PORT_REDIS, KeyFactory
from tests.support.apps import api_client

JOB = {"pipeline": "greet", "params": {"who": "limits"}}


@pytest.fixture
def limited(settings: Settings, runtime: Runtime) -> Iterator[TestClient]:
    strict = settings.model_copy(
        update={"rate_limit_per_s": 1.0, "rate_limit_burst": 3, "max_open_jobs_per_owner": 2}
    )
    with api_client(strict, runtime) as client:
        yield client


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _jobs_of(runtime: Runtime, owner: str) -> int:
    with runtime.sessions() as session:
        return session.scalar(select(func.count()).where(JobRow.owner == owner)) or 0


def test_a_key_past_its_burst_is_told_to_come_back_later(
    limited: TestClient, make_key: KeyFactory
) -> None:
    key, other = make_key("read"), make_key("read")

    answers = [limited.get("/v1/jobs", headers=_auth(key)) for _ in range(4)]

    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    refused = answers[-1]
    assert refused.json()["error"]["code"] == "rate_limited"
    assert int(refused.headers["Retry-After"]) >= 1
    assert limited.get("/v1/jobs", headers=_auth(other)).status_code == 200


def _window_of(runtime: Runtime, settings: Settings, key: str) -> int:
    with runtime.sessions() as session:
        key_id = session.scalar(select(ApiKeyRow.id).where(ApiKeyRow.prefix == key.split("_")[1]))
    client = redis.Redis.from_url(settings.require_broker_url())
    return int(client.zcard(f"{RATE_LIMIT_KEY_PREFIX}api-key:{key_id}"))


def test_a_stopping_api_gives_back_the_units_of_its_lease_no_request_used(
    settings: Settings, runtime: Runtime, make_key: KeyFactory
) -> None:
    leasing = settings.model_copy(
        update={"rate_limit_per_s": 1.0, "rate_limit_burst": 100, "rate_limit_lease": 5}
    )
    key = make_key("read")

    with api_client(leasing, runtime) as client:
        answers = [client.get("/v1/jobs", headers=_auth(key)) for _ in range(2)]
        held = _window_of(runtime, settings, key)

    assert [a.status_code for a in answers] == [200, 200]
    assert held == 5
    assert _window_of(runtime, settings, key) == 2


def test_a_key_is_not_refused_while_the_limits_redis_is_unreachable(
    settings: Settings, runtime: Runtime, make_key: KeyFactory
) -> None:
    cut_off = settings.model_copy(
        update={"rate_limit_per_s": 1.0, "rate_limit_burst": 1, "broker_url": CLOSED_PORT_REDIS}
    )
    key = make_key("read")

    with api_client(cut_off, runtime) as client:
        answers = [client.get("/v1/jobs", headers=_auth(key)) for _ in range(3)]

    assert [a.status_code for a in answers] == [200, 200, 200]


def test_health_is_never_limited(limited: TestClient) -> None:
    assert {limited.get("/health").status_code for _ in range(6)} <= {200, 503}


def test_an_owner_with_too_many_open_jobs_is_refused_and_nothing_is_stored(
    limited: TestClient, make_key: KeyFactory, runtime: Runtime
) -> None:
    owner = "open-cap"
    key = make_key("write", owner=owner)
    before = _jobs_of(runtime, owner)
    first = [limited.post("/v1/jobs", json=JOB, headers=_auth(key)) for _ in range(2)]
    assert [a.status_code for a in first] == [202, 202]

    refused = limited.post("/v1/jobs", json=JOB, headers=_auth(key))

    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "open_jobs_limit"
    assert refused.headers["Retry-After"] == "5"
    assert _jobs_of(runtime, owner) == before + 2
