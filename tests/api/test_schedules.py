"""Schedule routes: several per pipeline by id or name, the one-schedule routes for a pipeline with
one; each refusal has its own code, nothing is stored."""

import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.engine.runtime import Runtime
from service.platform.db import unit_of_work
from service.platform.models import ScheduleRow
from service.platform.settings import Settings
from service.triggers.firing import fire_schedule
from tests.api.conftest import KeyFactory

Headers = dict[str, str]
NAMES = [f"sched-{letter}" for letter in "abcdef"]


def _profile(name: str) -> str:
    return f"""\
name: {name}
params:
  since: {{type: integer, default: 2020}}
steps:
  - id: only
    action: noop
schedule:
  cron: "0 7 * * 1"
  timezone: Europe/Paris
  diff_mode: true
"""


@pytest.fixture(scope="module", autouse=True)
def scheduled_profiles(profiles_dir: Path) -> None:
    for name in NAMES:
        (profiles_dir / f"{name}.yaml").write_text(_profile(name), encoding="utf-8")


def _error(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == code and error["message"]
    return error


def _put(client: TestClient, headers: Headers, name: str = "sched-a", **body: Any) -> Any:
    return client.put(f"/v1/pipelines/{name}/schedule", json=body or None, headers=headers)


def test_a_schedule_is_saved_read_listed_and_deleted(client: TestClient, writer: Headers) -> None:
    saved = _put(
        client,
        writer,
        cron="30 6 * * *",
        timezone="America/New_York",
        params={"since": 2024},
        overlap="buffer_one",
        catchup="all",
        catchup_window="6h",
        jitter="5m",
    )
    assert saved.status_code == 200, saved.text
    schedule = saved.json()["schedule"]
    assert schedule["cron"] == "30 6 * * *" and schedule["every_s"] is None
    assert (schedule["catchup_window_s"], schedule["jitter_s"]) == (21600, 300)
    assert schedule["next_fire_at"].endswith("+00:00")
    assert (schedule["run_count"], schedule["last_status"], schedule["last_fire_at"]) == (
        0,
        None,
        None,
    )

    assert client.get("/v1/pipelines/sched-a/schedule", headers=writer).json() == saved.json()
    listed = client.get("/v1/schedules", headers=writer).json()["schedules"]
    assert [s["pipeline"] for s in listed] == ["sched-a"]

    assert client.delete("/v1/pipelines/sched-a/schedule", headers=writer).status_code == 204
    _error(client.get("/v1/pipelines/sched-a/schedule", headers=writer), 404, "schedule_not_found")


def test_an_empty_body_takes_the_profiles_schedule_block(
    client: TestClient, writer: Headers
) -> None:
    saved = client.put("/v1/pipelines/sched-b/schedule", headers=writer)
    assert saved.status_code == 200, saved.text
    schedule = saved.json()["schedule"]
    assert (schedule["cron"], schedule["timezone"], schedule["diff_mode"]) == (
        "0 7 * * 1",
        "Europe/Paris",
        True,
    )
    _error(client.put("/v1/pipelines/greet/schedule", headers=writer), 422, "validation_error")


def test_an_interval_schedule_is_stored_in_seconds(client: TestClient, writer: Headers) -> None:
    saved = _put(client, writer, every="6h", enabled=False)
    assert saved.json()["schedule"]["every_s"] == 21600
    assert saved.json()["schedule"]["next_fire_at"] is None


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"cron": "61 * * * *"}, 422, "cron_invalid"),
        ({"cron": "0 9 * * * *"}, 422, "cron_invalid"),
        ({"cron": "0 9 * * *", "timezone": "Europe/Atlantis"}, 422, "timezone_unknown"),
        ({"cron": "*/5 * * * *"}, 422, "schedule_too_frequent"),
        ({"every": "30m"}, 422, "schedule_too_frequent"),
        ({"every": "soon"}, 422, "interval_invalid"),
        ({"every": "2h", "params": {"since": "x"}}, 422, "params_invalid"),
        ({"every": "2h", "overlap": "queue"}, 422, "validation_error"),
        ({"every": "2h", "surprise": 1}, 422, "validation_error"),
    ],
)
def test_bad_schedules_are_refused_with_their_own_code_and_nothing_is_stored(
    client: TestClient, writer: Headers, body: dict[str, Any], status: int, code: str
) -> None:
    _error(_put(client, writer, **body), status, code)
    _error(client.get("/v1/pipelines/sched-a/schedule", headers=writer), 404, "schedule_not_found")


def test_an_unknown_pipeline_cannot_be_scheduled(client: TestClient, writer: Headers) -> None:
    _error(_put(client, writer, "nowhere", every="2h"), 404, "pipeline_not_found")


def test_a_sixth_enabled_schedule_is_refused(client: TestClient, writer: Headers) -> None:
    for name in NAMES[:5]:
        assert _put(client, writer, name, every="1h").status_code == 200
    _error(_put(client, writer, NAMES[5], every="1h"), 409, "schedule_limit_reached")
    assert _put(client, writer, NAMES[5], every="1h", enabled=False).status_code == 200
    assert _put(client, writer, NAMES[0], every="2h").status_code == 200
    assert len(client.get("/v1/schedules", headers=writer).json()["schedules"]) == 6


def test_owners_see_only_their_own_schedules_and_readers_cannot_write(
    client: TestClient, writer: Headers, make_key: KeyFactory
) -> None:
    assert _put(client, writer, every="2h").status_code == 200
    other = {"Authorization": f"Bearer {make_key('write')}"}
    assert client.get("/v1/schedules", headers=other).json() == {"schedules": []}
    _error(client.get("/v1/pipelines/sched-a/schedule", headers=other), 404, "schedule_not_found")
    reader = {"Authorization": f"Bearer {make_key('read')}"}
    _error(_put(client, reader, every="2h"), 403, "forbidden")


def test_a_saved_pipeline_is_scheduled_and_its_deletion_removes_the_schedule(
    client: TestClient, writer: Headers
) -> None:
    body = _profile("saved-weekly").replace("action: noop", "action: noop\n    with: {x: 1}")
    saved = client.put(
        "/v1/pipelines/saved-weekly",
        content=body,
        headers={**writer, "Content-Type": "application/yaml"},
    )
    assert saved.status_code == 201, saved.text

    scheduled = _put(client, writer, name="saved-weekly")
    assert scheduled.status_code == 200, scheduled.text
    assert scheduled.json()["schedule"]["cron"] == "0 7 * * 1"

    assert client.delete("/v1/pipelines/saved-weekly", headers=writer).status_code == 200
    gone = client.get("/v1/pipelines/saved-weekly/schedule", headers=writer)
    _error(gone, 404, "schedule_not_found")


def test_a_job_made_by_a_fire_shows_its_schedule_and_fire_time(
    client: TestClient, writer: Headers, runtime: Runtime, settings: Settings
) -> None:
    saved = _put(client, writer, name="sched-f", every="1h", timezone="UTC")
    assert saved.status_code == 200, saved.text
    schedule_id = uuid.UUID(saved.json()["schedule"]["id"])
    with unit_of_work(runtime.sessions) as session:
        row = session.get(ScheduleRow, schedule_id)
        assert row is not None and row.next_fire_at is not None
        fire_at = row.next_fire_at
        fired = fire_schedule(
            session,
            schedule_id,
            now=fire_at + timedelta(seconds=1),
            grace_s=60,
            profiles_dir=settings.profiles_dir,
            known_actions=runtime.registry.names(),
        )
    (job,) = fired.jobs

    shown = client.get(f"/v1/jobs/{job.id}", headers=writer).json()["job"]
    assert shown["trigger"] == "schedule"
    assert shown["schedule_id"] == str(schedule_id)
    assert datetime.fromisoformat(shown["scheduled_for"]) == fire_at


def _schedules(name: str = "sched-a") -> str:
    return f"/v1/pipelines/{name}/schedules"


def test_a_pipeline_has_several_schedules_each_with_its_own_id_name_params_and_priority(
    client: TestClient, writer: Headers
) -> None:
    daily = client.post(
        _schedules(),
        json={"name": "daily", "cron": "0 6 * * *", "params": {"since": 2025}, "priority": 8},
        headers=writer,
    )
    monthly = client.post(
        _schedules(),
        json={"name": "monthly", "cron": "0 6 1 * *", "overlap": "allow"},
        headers=writer,
    )
    assert (daily.status_code, monthly.status_code) == (201, 201), monthly.text
    first, second = daily.json()["schedule"], monthly.json()["schedule"]
    assert (first["name"], first["params"], first["priority"]) == ("daily", {"since": 2025}, 8)
    assert (second["name"], second["params"], second["priority"]) == ("monthly", {}, None)
    assert (first["overlap"], second["overlap"]) == ("skip", "allow")

    listed = client.get(_schedules(), headers=writer).json()["schedules"]
    assert [(s["id"], s["name"]) for s in listed] == [
        (first["id"], "daily"),
        (second["id"], "monthly"),
    ]
    everything = client.get("/v1/schedules", headers=writer).json()["schedules"]
    assert {s["id"] for s in everything} == {first["id"], second["id"]}
    by_name = client.get(f"{_schedules()}/monthly", headers=writer).json()["schedule"]
    by_id = client.get(f"{_schedules()}/{second['id']}", headers=writer).json()["schedule"]
    assert by_name == by_id == second

    replaced = client.put(
        f"{_schedules()}/daily", json={"cron": "0 5 * * *", "priority": 2}, headers=writer
    )
    assert replaced.status_code == 200, replaced.text
    assert (replaced.json()["schedule"]["id"], replaced.json()["schedule"]["name"]) == (
        first["id"],
        "daily",
    )
    assert (replaced.json()["schedule"]["cron"], replaced.json()["schedule"]["priority"]) == (
        "0 5 * * *",
        2,
    )

    assert client.delete(f"{_schedules()}/{first['id']}", headers=writer).status_code == 204
    remaining = client.get(_schedules(), headers=writer).json()["schedules"]
    assert [s["name"] for s in remaining] == ["monthly"]
    _error(client.get(f"{_schedules()}/daily", headers=writer), 404, "schedule_not_found")


def test_the_one_schedule_routes_work_with_one_schedule_and_refuse_several(
    client: TestClient, writer: Headers
) -> None:
    one = _put(client, writer, every="2h").json()["schedule"]
    assert _put(client, writer, every="3h").json()["schedule"]["id"] == one["id"]
    extra = client.post(_schedules(), json={"name": "nightly", "every": "1d"}, headers=writer)
    assert extra.status_code == 201, extra.text

    for answer in (
        client.get("/v1/pipelines/sched-a/schedule", headers=writer),
        _put(client, writer, every="4h"),
        client.delete("/v1/pipelines/sched-a/schedule", headers=writer),
    ):
        error = _error(answer, 409, "schedule_ambiguous")
        assert [s["id"] for s in error["details"]["schedules"]] == [
            one["id"],
            extra.json()["schedule"]["id"],
        ]

    assert client.delete(f"{_schedules()}/nightly", headers=writer).status_code == 204
    kept = client.get("/v1/pipelines/sched-a/schedule", headers=writer).json()["schedule"]
    assert (kept["id"], kept["every_s"]) == (one["id"], 10800)


def test_schedule_names_are_unique_per_pipeline_and_refusals_store_nothing(
    client: TestClient, writer: Headers
) -> None:
    body = {"name": "daily", "every": "1d"}
    assert client.post(_schedules(), json=body, headers=writer).status_code == 201
    _error(client.post(_schedules(), json=body, headers=writer), 409, "schedule_name_taken")
    assert client.post(_schedules("sched-b"), json=body, headers=writer).status_code == 201
    other = client.post(_schedules(), json={"name": "weekly", "every": "7d"}, headers=writer)
    renamed = client.put(
        f"{_schedules()}/{other.json()['schedule']['id']}", json=body, headers=writer
    )
    _error(renamed, 409, "schedule_name_taken")
    for refused in (
        {"name": str(uuid.uuid4()), "every": "1d"},
        {"name": "Daily Run", "every": "1d"},
        {"name": "hourly", "every": "1d", "priority": 10},
    ):
        _error(client.post(_schedules(), json=refused, headers=writer), 422, "validation_error")
    names = [s["name"] for s in client.get(_schedules(), headers=writer).json()["schedules"]]
    assert names == ["daily", "weekly"]
    _error(
        client.put(f"{_schedules()}/{uuid.uuid4()}", json=body, headers=writer),
        404,
        "schedule_not_found",
    )
    _error(
        client.put(f"{_schedules()}/hourly", json=body, headers=writer),
        422,
        "schedule_name_mismatch",
    )
    _error(client.post(_schedules("nowhere"), json=body, headers=writer), 404, "pipeline_not_found")


def test_an_empty_body_creates_a_schedule_from_the_profiles_block(
    client: TestClient, writer: Headers
) -> None:
    created = client.post(_schedules("sched-b"), headers=writer)
    assert created.status_code == 201, created.text
    assert (created.json()["schedule"]["cron"], created.json()["schedule"]["name"]) == (
        "0 7 * * 1",
        None,
    )


def test_a_schedules_fire_submits_at_its_own_priority(
    client: TestClient, writer: Headers, runtime: Runtime, settings: Settings
) -> None:
    saved = client.post(
        _schedules("sched-f"), json={"name": "urgent", "every": "1h", "priority": 9}, headers=writer
    )
    assert saved.status_code == 201, saved.text
    schedule_id = uuid.UUID(saved.json()["schedule"]["id"])
    with unit_of_work(runtime.sessions) as session:
        row = session.get(ScheduleRow, schedule_id)
        assert row is not None and row.next_fire_at is not None
        (job,) = fire_schedule(
            session,
            schedule_id,
            now=row.next_fire_at + timedelta(seconds=1),
            grace_s=60,
            profiles_dir=settings.profiles_dir,
            known_actions=runtime.registry.names(),
        ).jobs

    shown = client.get(f"/v1/jobs/{job.id}", headers=writer).json()["job"]
    assert (shown["schedule_id"], shown["priority"]) == (str(schedule_id), 9)


def test_putting_a_schedule_under_a_new_name_creates_it_then_replaces_it(
    client: TestClient, writer: Headers
) -> None:
    created = client.put(f"{_schedules()}/weekly", json={"cron": "0 8 * * 1"}, headers=writer)
    assert created.status_code == 201, created.text
    again = client.put(f"{_schedules()}/weekly", json={"cron": "0 9 * * 1"}, headers=writer)
    assert again.status_code == 200, again.text
    assert again.json()["schedule"]["id"] == created.json()["schedule"]["id"]
    assert (again.json()["schedule"]["name"], again.json()["schedule"]["cron"]) == (
        "weekly",
        "0 9 * * 1",
    )
