"""``GET /v1/overview``: every figure is what the job, approval and schedule lists hold for the
same key, and the broker's part is missing, not the whole answer, when the broker is away."""

import uuid
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from api.routes.overview import LISTED
from service.alerts.offers import Candidate, Offered, offer
from service.engine.runtime import Runtime
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from service.platform.models import AlertRuleRow, JobRow
from tests.api.conftest import KeyFactory
from tests.support.approvals import parked_job
from tests.support.arrange import walk

Headers = dict[str, str]
OUTCOMES = ("succeeded", "failed", "failed", "cancelled", "queued", "queued")


@pytest.fixture
def headers(make_key: KeyFactory) -> Headers:
    return {"Authorization": f"Bearer {make_key('read', 'write')}"}


def submit(client: TestClient, headers: Headers) -> uuid.UUID:
    answer = client.post(
        "/v1/jobs", json={"pipeline": "greet", "params": {"who": "ada"}}, headers=headers
    )
    assert answer.status_code == 202, answer.text
    return uuid.UUID(answer.json()["job"]["id"])


def settle(runtime: Runtime, job_id: uuid.UUID, status: str, took_s: float) -> None:
    with unit_of_work(runtime.sessions) as session:
        walk(session, JobRow, JobRow.id == job_id, to=status)
        session.execute(
            update(JobRow)
            .where(JobRow.id == job_id)
            .values(
                started_at=JobRow.created_at,
                finished_at=JobRow.created_at + timedelta(seconds=took_s),
            )
        )


def raise_alerts(
    client: TestClient,
    runtime: Runtime,
    headers: Headers,
    owner: str,
    count: int,
    monkeypatch: pytest.MonkeyPatch,
) -> uuid.UUID:
    """``count`` alerts of a rule named ``watch``, queued as the matcher queues them, each
    about the same job; its id is returned."""
    monkeypatch.setenv("FLOWBEAT_SECRET_WATCH_KEY", "s3cret")
    rule = {
        "kind": "job_failed",
        "url": "https://hooks.example.com/a",
        "secret": "WATCH_KEY",
        "dedupe_s": 0,
    }
    assert client.put("/v1/alerts/watch", json=rule, headers=headers).status_code == 201
    job_id = uuid.uuid4()
    with unit_of_work(runtime.sessions) as session:
        saved = session.scalar(
            select(AlertRuleRow).where(AlertRuleRow.owner == owner, AlertRuleRow.name == "watch")
        )
        assert saved is not None
        for n in range(count):
            details = {"job_id": str(job_id)}
            candidate = Candidate(saved, f"event:{n}", f"pipeline:p{n}", f"failure {n}", details)
            offer(session, candidate, utcnow(), Offered())
    return job_id


def _listed(client: TestClient, headers: Headers, **query: Any) -> int:
    answer = client.get("/v1/jobs", params={"limit": 200, **query}, headers=headers)
    assert answer.status_code == 200, answer.text
    return len(answer.json()["jobs"])


def test_the_figures_are_what_the_job_list_holds(
    client: TestClient, headers: Headers, runtime: Runtime
) -> None:
    for n, outcome in enumerate(OUTCOMES):
        job_id = submit(client, headers)
        if outcome != "queued":
            settle(runtime, job_id, outcome, took_s=n + 1)

    answer = client.get("/v1/overview", headers=headers)

    assert answer.status_code == 200, answer.text
    overview = answer.json()
    assert (
        overview["totals"]
        == {
            "started": _listed(client, headers),
            "succeeded": _listed(client, headers, status="succeeded"),
            "failed": _listed(client, headers, status="failed"),
        }
        == {"started": 6, "succeeded": 1, "failed": 2}
    )
    assert overview["open"]["queued"] == _listed(client, headers, status="queued") == 2
    assert sum(b["started"] for b in overview["series"]) == 6
    assert (len(overview["series"]), overview["bucket_s"]) == (60, 60)
    assert overview["failing"] == [{"pipeline": "greet", "failed": 2, "runs": 6}]
    (slowest,) = overview["slowest"]
    assert (slowest["pipeline"], slowest["runs"], slowest["max_s"]) == ("greet", 1, 1.0)


def test_the_day_is_drawn_in_quarter_hours(client: TestClient, headers: Headers) -> None:
    submit(client, headers)

    overview = client.get("/v1/overview?window=day", headers=headers).json()

    assert (len(overview["series"]), overview["bucket_s"]) == (96, 900)
    assert overview["totals"]["started"] == 1


def test_waiting_approvals_are_counted_as_the_approvals_list_shows_them(
    client: TestClient, headers: Headers, runtime: Runtime
) -> None:
    first = parked_job(client, headers, runtime)
    parked_job(client, headers, runtime)

    overview = client.get("/v1/overview", headers=headers).json()

    listed = client.get("/v1/approvals", headers=headers).json()["approvals"]
    assert overview["approvals"]["waiting"] == len(listed) == 2
    assert overview["approvals"]["oldest"][0]["job_id"] == first
    assert overview["open"]["awaiting_approval"] == _listed(
        client, headers, status="awaiting_approval"
    )


def test_the_next_fires_are_the_schedules_soonest_first(
    client: TestClient, headers: Headers
) -> None:
    saved = client.put(
        "/v1/pipelines/greet/schedule",
        json={"every": "1h", "params": {"who": "ada"}},
        headers=headers,
    )
    assert saved.status_code in (200, 201), saved.text

    (fire,) = client.get("/v1/overview", headers=headers).json()["schedules"]

    schedule = saved.json()["schedule"]
    assert (fire["schedule_id"], fire["next_fire_at"]) == (schedule["id"], schedule["next_fire_at"])


def test_another_owners_jobs_are_not_counted(
    client: TestClient, headers: Headers, make_key: KeyFactory
) -> None:
    submit(client, headers)
    stranger = {"Authorization": f"Bearer {make_key('read')}"}

    overview = client.get("/v1/overview", headers=stranger).json()

    assert overview["totals"] == {"started": 0, "succeeded": 0, "failed": 0}
    assert overview["open"] == {"awaiting_approval": 0, "queued": 0, "running": 0}


def test_the_last_alerts_are_the_newest_deliveries_of_the_keys_own_rules(
    client: TestClient, make_key: KeyFactory, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = f"o-{uuid.uuid4().hex[:8]}"
    mine = {"Authorization": f"Bearer {make_key('read', 'write', owner=owner)}"}
    job_id = raise_alerts(client, runtime, mine, owner, LISTED + 2, monkeypatch)
    stranger = {"Authorization": f"Bearer {make_key('read')}"}

    shown = client.get("/v1/overview", headers=mine).json()["alerts"]

    listed = client.get(
        "/v1/alerts/watch/deliveries", params={"limit": LISTED}, headers=mine
    ).json()["deliveries"]
    assert [a["delivery_id"] for a in shown] == [d["delivery_id"] for d in listed]
    assert len(shown) == LISTED
    newest = shown[0]
    assert (newest["rule"], newest["summary"], newest["status"], newest["job_id"]) == (
        "watch",
        f"failure {LISTED + 1}",
        "pending",
        str(job_id),
    )
    assert client.get("/v1/overview", headers=stranger).json()["alerts"] == []


def test_the_queues_are_listed_as_the_queue_list_shows_them(
    client: TestClient, headers: Headers
) -> None:
    submit(client, headers)

    overview = client.get("/v1/overview", headers=headers).json()

    listed = client.get("/v1/queues", headers=headers).json()["queues"]
    assert [q["name"] for q in overview["queues"]] == [q["name"] for q in listed]
    assert overview["broker_error"] is None and overview["workers"] is not None


def test_with_the_broker_away_the_rest_still_answers(
    broken_broker_client: TestClient, headers: Headers
) -> None:
    answer = broken_broker_client.get("/v1/overview", headers=headers)

    assert answer.status_code == 200, answer.text
    overview = answer.json()
    assert overview["queues"] is None and overview["workers"] is None
    assert overview["broker_error"].startswith("the broker did not answer")


def test_an_unknown_window_is_refused(client: TestClient, headers: Headers) -> None:
    answer = client.get("/v1/overview?window=week", headers=headers)

    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "invalid_query"


def test_the_overview_needs_a_key(client: TestClient) -> None:
    assert client.get("/v1/overview").status_code == 401
