"""Backfill routes: stored and audited, listed with their progress, cancelled whole; each bad
request refused with its own code and nothing stored."""

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from service.engine.runtime import Runtime
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from service.platform.models import AuditEventRow, JobRow
from service.triggers.backfills import top_up
from tests.api.conftest import KeyFactory
from tests.support.arrange import walk

Headers = dict[str, str]
PROFILE = """\
name: {name}
steps:
  - id: only
    action: noop
schedule:
  cron: "0 6 * * *"
  timezone: Europe/Paris
"""
BASE = "/v1/pipelines/bf-daily/schedules/{schedule}/backfill"


@pytest.fixture(scope="module", autouse=True)
def scheduled_profiles(profiles_dir: Path) -> None:
    for name in ("bf-daily", "bf-every"):
        (profiles_dir / f"{name}.yaml").write_text(PROFILE.format(name=name), encoding="utf-8")


@pytest.fixture
def schedule_id(client: TestClient, writer: Headers) -> str:
    saved = client.put("/v1/pipelines/bf-daily/schedule", headers=writer)
    assert saved.status_code == 200, saved.text
    return str(saved.json()["schedule"]["id"])


def days_ago(days: int) -> str:
    start = utcnow().replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=days)
    return start.isoformat()


def _error(response: Any, code: str) -> None:
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == code


def test_a_backfill_is_stored_audited_listed_and_cancelled(
    client: TestClient, writer: Headers, runtime: Runtime, schedule_id: str
) -> None:
    url = BASE.format(schedule=schedule_id)
    body = {"from": days_ago(5), "to": days_ago(1), "max_active": 2}
    made = client.post(url, json=body, headers=writer)
    assert made.status_code == 201, made.text
    backfill = made.json()["backfill"]
    assert (backfill["total"], backfill["pending"], backfill["status"]) == (4, 4, "running")
    assert (backfill["cron"], backfill["timezone"]) == ("0 6 * * *", "Europe/Paris")
    with unit_of_work(runtime.sessions) as session:
        started = top_up(
            session,
            uuid.UUID(backfill["id"]),
            profiles_dir=runtime.settings.profiles_dir,
            known_actions=runtime.registry.names(),
            now=utcnow(),
        )
    assert len(started.jobs) == 2
    read = client.get(f"{url}/{backfill['id']}", headers=writer).json()["backfill"]
    assert (read["started"], read["open"], read["pending"]) == (2, 2, 2)
    assert [fire["status"] for fire in read["fires"]] == ["queued", "queued"]
    assert read["fires"][0]["fire_at"] < read["fires"][1]["fire_at"]
    listed = client.get(url, headers=writer).json()["backfills"]
    assert [item["id"] for item in listed] == [backfill["id"]]
    whole = client.get("/v1/pipelines/bf-daily/backfills", headers=writer).json()["backfills"]
    assert [item["id"] for item in whole] == [backfill["id"]]

    cancelled = client.post(f"{url}/{backfill['id']}/cancel", headers=writer)
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["backfill"]["status"] == "cancelled"
    assert cancelled.json()["backfill"]["jobs"] == {"cancelled": 2}
    again = client.post(f"{url}/{backfill['id']}/cancel", headers=writer)
    assert again.json()["backfill"]["status"] == "cancelled"
    with unit_of_work(runtime.sessions) as session:
        actions = session.scalars(
            select(AuditEventRow.action)
            .where(AuditEventRow.target_id == backfill["id"])
            .order_by(AuditEventRow.id)
        ).all()
    assert actions == ["backfill.create", "backfill.cancel"]


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"from": days_ago(1), "to": days_ago(5)}, "backfill_invalid"),
        ({"from": days_ago(5), "to": days_ago(-2)}, "backfill_invalid"),
        ({"from": days_ago(5), "to": days_ago(1), "max_active": 0}, "backfill_invalid"),
        ({"from": days_ago(5000), "to": days_ago(1)}, "backfill_too_large"),
        ({"from": "2026-01-01T00:00:00", "to": days_ago(1)}, "validation_error"),
        ({"from": days_ago(5)}, "validation_error"),
    ],
    ids=["backwards", "future", "max-active-0", "too-large", "no-zone", "no-end"],
)
def test_a_bad_backfill_is_refused_with_its_code_and_nothing_is_stored(
    client: TestClient, writer: Headers, schedule_id: str, body: dict[str, Any], code: str
) -> None:
    url = BASE.format(schedule=schedule_id)
    _error(client.post(url, json=body, headers=writer), code)
    assert client.get(url, headers=writer).json()["backfills"] == []


def test_an_interval_schedule_is_not_backfilled(client: TestClient, writer: Headers) -> None:
    saved = client.put(
        "/v1/pipelines/bf-every/schedule", json={"every": "1d"}, headers=writer
    ).json()
    url = f"/v1/pipelines/bf-every/schedules/{saved['schedule']['id']}/backfill"
    body = {"from": days_ago(5), "to": days_ago(1)}
    _error(client.post(url, json=body, headers=writer), "backfill_not_cron")


def test_another_owners_backfill_is_not_found(
    client: TestClient, writer: Headers, make_key: KeyFactory, schedule_id: str
) -> None:
    url = BASE.format(schedule=schedule_id)
    made = client.post(url, json={"from": days_ago(3), "to": days_ago(1)}, headers=writer)
    backfill_id = made.json()["backfill"]["id"]
    stranger = {"Authorization": f"Bearer {make_key('write')}"}
    assert client.get(f"{url}/{backfill_id}", headers=stranger).status_code == 404
    unknown = f"{url}/{'0' * 8}-0000-0000-0000-{'0' * 12}"
    missing = client.get(unknown, headers=writer)
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "backfill_not_found")
    client.post(f"{url}/{backfill_id}/cancel", headers=writer)


def test_a_completed_backfill_cannot_be_cancelled(
    client: TestClient, writer: Headers, runtime: Runtime, schedule_id: str
) -> None:
    url = BASE.format(schedule=schedule_id)
    made = client.post(url, json={"from": days_ago(2), "to": days_ago(1)}, headers=writer)
    backfill_id = made.json()["backfill"]["id"]
    with unit_of_work(runtime.sessions) as session:
        for _ in range(2):
            for job in top_up(
                session,
                uuid.UUID(backfill_id),
                profiles_dir=runtime.settings.profiles_dir,
                known_actions=runtime.registry.names(),
                now=datetime.now(UTC),
            ).jobs:
                walk(session, JobRow, JobRow.id == job.id, to="succeeded")
    refused = client.post(f"{url}/{backfill_id}/cancel", headers=writer)
    assert (refused.status_code, refused.json()["error"]["code"]) == (409, "backfill_conflict")
