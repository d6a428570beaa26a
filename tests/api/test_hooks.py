"""Webhook routes: admins bind a hook to a pipeline; a signed delivery starts one job, once."""

import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from service.engine.runtime import Runtime
from service.platform.metrics import registry
from service.platform.models import HookDeliveryRow, HookRow, JobRow
from service.platform.settings import Settings
from tests.api.conftest import MAX_BODY, KeyFactory
from tests.support.apps import api_client
from tests.support.webhook import signed_headers

MAPPING = {"who": "${{ payload.repository.name }}", "count": 2}


def _admin(make_key: KeyFactory) -> dict[str, str]:
    return {"Authorization": f"Bearer {make_key('admin')}"}


def _hook(client: TestClient, make_key: KeyFactory, **body: Any) -> tuple[str, str]:
    name = f"hook-{uuid.uuid4().hex[:8]}"
    answer = client.put(
        f"/v1/hooks/{name}",
        json={"pipeline": "greet", "params": MAPPING, **body},
        headers=_admin(make_key),
    )
    assert answer.status_code == 201, answer.text
    secret: str = answer.json()["secret"]
    return name, secret


def _deliver(
    client: TestClient,
    name: str,
    secret: str,
    payload: Any,
    *,
    delivery: str | None = None,
    at: float | None = None,
    raw: bytes | None = None,
) -> Any:
    body = raw if raw is not None else json.dumps(payload).encode()
    headers = signed_headers(secret, delivery or uuid.uuid4().hex, body, at=at)
    return client.post(f"/v1/hooks/{name}", content=body, headers=headers)


@pytest.fixture
def stored(runtime: Runtime) -> Callable[[], tuple[int, int]]:
    def count() -> tuple[int, int]:
        with runtime.sessions() as session:
            jobs = session.scalar(select(func.count()).select_from(JobRow)) or 0
            seen = session.scalar(select(func.count()).select_from(HookDeliveryRow)) or 0
            return jobs, seen

    return count


def test_a_signed_delivery_starts_a_job_with_params_from_its_payload(
    client: TestClient, make_key: KeyFactory
) -> None:
    name, secret = _hook(client, make_key)

    answer = _deliver(client, name, secret, {"repository": {"name": "flowbeat"}})

    assert answer.status_code == 202, answer.text
    job = answer.json()["job"]
    assert (job["trigger"], job["pipeline"]) == ("webhook", "greet")
    assert job["params"] == {"who": "flowbeat", "count": 2}


def test_a_hook_labels_its_jobs_with_labels_that_read_their_params(
    client: TestClient, make_key: KeyFactory
) -> None:
    labels = {"repo": "${{ params.who }}", "source": "github"}
    name, secret = _hook(client, make_key, labels=labels)

    answer = _deliver(client, name, secret, {"repository": {"name": "flowbeat"}})

    assert answer.status_code == 202, answer.text
    assert answer.json()["job"]["labels"] == {"repo": "flowbeat", "source": "github"}
    bad = client.put(
        f"/v1/hooks/{name}",
        json={"pipeline": "greet", "params": MAPPING, "labels": {"x": "${{ payload.a }}"}},
        headers=_admin(make_key),
    )
    assert bad.status_code == 422, bad.text


def test_a_replayed_delivery_gets_the_first_job_back(
    client: TestClient, make_key: KeyFactory, stored: Callable[[], tuple[int, int]]
) -> None:
    name, secret = _hook(client, make_key)
    payload = {"repository": {"name": "once"}}
    counted = {outcome: _deliveries(outcome) for outcome in ("accepted", "replayed")}
    first = _deliver(client, name, secret, payload, delivery="same")
    before = stored()

    again = _deliver(client, name, secret, payload, delivery="same")

    assert again.status_code == 200
    assert again.json()["job"]["id"] == first.json()["job"]["id"]
    assert stored() == before
    assert {outcome: _deliveries(outcome) - n for outcome, n in counted.items()} == {
        "accepted": 1,
        "replayed": 1,
    }


@pytest.mark.parametrize(("pipeline", "status"), [("search", 200), ("search-once", 409)])
def test_a_delivery_that_duplicates_an_open_job_gets_it_back_or_is_refused(
    client: TestClient,
    make_key: KeyFactory,
    stored: Callable[[], tuple[int, int]],
    pipeline: str,
    status: int,
) -> None:
    name, secret = _hook(client, make_key, pipeline=pipeline, params={"query": "${{ payload.q }}"})
    payload = {"q": f"crispr-{uuid.uuid4().hex[:6]}"}
    first = _deliver(client, name, secret, payload)
    assert first.status_code == 202, first.text
    jobs, seen = stored()

    again = _deliver(client, name, secret, payload)

    assert again.status_code == status, again.text
    job_id = first.json()["job"]["id"]
    if status == 200:
        assert (again.json()["deduplicated"], again.json()["job"]["id"]) == (True, job_id)
        assert stored() == (jobs, seen + 1)
    else:
        error = again.json()["error"]
        assert (error["code"], error["details"]["job_id"]) == ("duplicate_job", job_id)
        assert stored() == (jobs, seen)


def _deliveries(outcome: str) -> float:
    series = {"outcome": outcome}
    return registry().get_sample_value("flowbeat_webhook_deliveries_total", series) or 0.0


def test_a_captured_delivery_sent_under_a_new_delivery_id_is_refused(
    client: TestClient, make_key: KeyFactory, stored: Callable[[], tuple[int, int]]
) -> None:
    name, secret = _hook(client, make_key)
    body = json.dumps({"repository": {"name": "captured"}}).encode()
    captured = signed_headers(secret, "original", body)
    assert client.post(f"/v1/hooks/{name}", content=body, headers=captured).status_code == 202
    before = stored()

    forged = client.post(
        f"/v1/hooks/{name}", content=body, headers={**captured, "X-Flowbeat-Delivery": "forged"}
    )

    assert forged.status_code == 401
    assert forged.json()["error"]["code"] == "hook_signature_invalid"
    assert stored() == before


def test_a_signed_message_already_fenced_under_another_id_makes_no_second_job(
    client: TestClient,
    make_key: KeyFactory,
    runtime: Runtime,
    stored: Callable[[], tuple[int, int]],
) -> None:
    name, secret = _hook(client, make_key)
    body = json.dumps({"repository": {"name": "fenced"}}).encode()
    headers = signed_headers(secret, "d-1", body)
    with runtime.sessions() as session, session.begin():
        hook_id = session.scalar(select(HookRow.id).where(HookRow.name == name))
        digest = headers["X-Flowbeat-Signature"].removeprefix("sha256=")
        session.add(HookDeliveryRow(hook_id=hook_id, delivery_id="other", signature=digest))
    before = stored()

    answer = client.post(f"/v1/hooks/{name}", content=body, headers=headers)

    assert answer.status_code == 409
    assert answer.json()["error"]["code"] == "hook_delivery_seen"
    assert stored() == before


@pytest.fixture
def capped(settings: Settings, runtime: Runtime) -> Iterator[TestClient]:
    with api_client(settings.model_copy(update={"max_open_jobs_per_owner": 1}), runtime) as client:
        yield client


def test_a_delivery_counts_against_the_hook_owners_open_jobs(
    capped: TestClient, make_key: KeyFactory, stored: Callable[[], tuple[int, int]]
) -> None:
    name, secret = _hook(capped, make_key)
    first = _deliver(capped, name, secret, {"repository": {"name": "one"}}, delivery="d-1")
    assert first.status_code == 202, first.text
    before = stored()

    refused = _deliver(capped, name, secret, {"repository": {"name": "two"}}, delivery="d-2")
    retried = _deliver(capped, name, secret, {"repository": {"name": "one"}}, delivery="d-1")

    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "open_jobs_limit"
    assert int(refused.headers["Retry-After"]) >= 1
    assert stored() == before
    assert retried.status_code == 200
    assert retried.json()["job"]["id"] == first.json()["job"]["id"]


@pytest.fixture
def limited(settings: Settings, runtime: Runtime) -> Iterator[TestClient]:
    strict = settings.model_copy(update={"rate_limit_per_s": 0.1, "rate_limit_burst": 3})
    with api_client(strict, runtime) as client:
        yield client


def test_a_flood_of_forged_deliveries_is_rate_limited_per_hook(
    limited: TestClient, make_key: KeyFactory, stored: Callable[[], tuple[int, int]]
) -> None:
    name, secret = _hook(limited, make_key)
    other, other_secret = _hook(limited, make_key)
    payload = {"repository": {"name": "flood"}}
    before = stored()

    forged = [_deliver(limited, name, "whsec_" + "f" * 30, payload) for _ in range(3)]
    refused = _deliver(limited, name, secret, payload)

    assert [answer.status_code for answer in forged] == [401, 401, 401]
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limited"
    assert int(refused.headers["Retry-After"]) >= 1
    assert stored() == before
    assert _deliver(limited, other, other_secret, payload).status_code == 202


@pytest.mark.parametrize(
    ("tamper", "status", "code"),
    [
        ("signature", 401, "hook_signature_invalid"),
        ("stale", 401, "hook_timestamp_stale"),
        ("unknown", 404, "hook_not_found"),
        ("huge", 413, "payload_too_large"),
        ("not-json", 422, "hook_payload_invalid"),
        ("unmapped", 422, "hook_payload_invalid"),
    ],
)
def test_a_refused_delivery_stores_nothing(
    client: TestClient,
    make_key: KeyFactory,
    stored: Callable[[], tuple[int, int]],
    tamper: str,
    status: int,
    code: str,
) -> None:
    name, secret = _hook(client, make_key)
    payload: Any = {"repository": {"name": "x"}}
    before = stored()
    if tamper == "signature":
        answer = _deliver(client, name, "whsec_" + "w" * 30, payload)
    elif tamper == "stale":
        answer = _deliver(client, name, secret, payload, at=time.time() - 600)
    elif tamper == "unknown":
        answer = _deliver(client, "no-such-hook", secret, payload)
    elif tamper == "huge":
        answer = _deliver(client, name, secret, None, raw=b"[" + b"1," * MAX_BODY + b"1]")
    elif tamper == "not-json":
        answer = _deliver(client, name, secret, None, raw=b"<xml/>")
    else:
        answer = _deliver(client, name, secret, {"sender": "nobody"})

    assert answer.status_code == status, answer.text
    assert answer.json()["error"]["code"] == code
    assert stored() == before


def test_the_secret_is_shown_once_and_admins_alone_manage_hooks(
    client: TestClient, make_key: KeyFactory
) -> None:
    name, secret = _hook(client, make_key)
    admin = _admin(make_key)

    shown = client.get(f"/v1/hooks/{name}", headers=admin).json()
    listed = client.get("/v1/hooks", headers=admin).json()["hooks"]
    replaced = client.put(
        f"/v1/hooks/{name}", json={"pipeline": "greet", "params": MAPPING}, headers=admin
    )
    writer = {"Authorization": f"Bearer {make_key('write')}"}

    assert secret.startswith("whsec_") and shown["secret"] is None
    assert secret not in json.dumps(listed)
    assert replaced.status_code == 200 and replaced.json()["secret"] is None
    assert client.get(f"/v1/hooks/{name}", headers=writer).status_code == 403
    assert client.delete(f"/v1/hooks/{name}", headers=admin).status_code == 204
    assert client.get(f"/v1/hooks/{name}", headers=admin).status_code == 404


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"pipeline": "greet", "params": {"who": "${{ steps.a.output }}"}}, "hook_invalid"),
        ({"pipeline": "no-such-pipeline"}, "pipeline_not_found"),
        ({"pipeline": "greet", "params": {"whom": "x"}}, "hook_invalid"),
        ({"pipeline": "greet", "secret": "short"}, "validation_error"),
    ],
)
def test_a_hook_that_cannot_work_is_refused(
    client: TestClient, make_key: KeyFactory, body: dict[str, Any], code: str
) -> None:
    answer = client.put(f"/v1/hooks/h-{uuid.uuid4().hex[:6]}", json=body, headers=_admin(make_key))
    assert answer.json()["error"]["code"] == code
