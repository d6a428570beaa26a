"""The audit trail through the API: each change a key makes records exactly one event, in the
change's transaction, naming the key's prefix and owner, the route, the action and the target;
a refused change records nothing; ``GET /v1/audit`` is for admin keys, filtered and paged."""

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import delete, select

from service.engine.claims import claim_step
from service.engine.runtime import Runtime
from service.engine.steps import StepKey
from service.platform.audit import Actor, Target, record
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from service.platform.models import AuditEventRow
from service.platform.settings import Settings
from tests.api.conftest import GREET, KeyFactory
from tests.support.approvals import parked_job
from tests.support.apps import api_client

Headers = dict[str, str]


class Caller:
    """A key of a fresh owner, with its prefix as the trail names it."""

    def __init__(self, make_key: KeyFactory, *scopes: str) -> None:
        self.owner = f"audit-{uuid.uuid4().hex[:8]}"
        self.key = make_key(*scopes, owner=self.owner)
        self.prefix = self.key.split("_")[1]
        self.headers = {"Authorization": f"Bearer {self.key}"}


def events(runtime: Runtime, owner: str) -> list[AuditEventRow]:
    with runtime.sessions() as session:
        query = select(AuditEventRow).where(AuditEventRow.owner == owner)
        return list(session.scalars(query.order_by(AuditEventRow.id)))


def only(runtime: Runtime, caller: Caller, action: str, target: str) -> AuditEventRow:
    """The one event of ``action``; and it names the caller as the API does."""
    trail = events(runtime, caller.owner)
    found = [e for e in trail if (e.action, f"{e.target_kind}:{e.target_id}") == (action, target)]
    assert len(found) == 1, [(e.action, e.target_id) for e in trail]
    event = found[0]
    assert (event.channel, event.actor, event.owner) == ("api", caller.prefix, caller.owner)
    assert event.at.tzinfo is not None and abs(utcnow() - event.at) < timedelta(minutes=1)
    return event


def _job(client: TestClient, caller: Caller, pipeline: Any = "greet", **body: Any) -> str:
    params = {"who": "a"} if pipeline == "greet" else {}
    body = {"pipeline": pipeline, "params": params, **body}
    answer = client.post("/v1/jobs", json=body, headers=caller.headers)
    assert answer.status_code in (200, 202), answer.text
    job_id: str = answer.json()["job"]["id"]
    return job_id


@pytest.fixture
def caller(make_key: KeyFactory) -> Caller:
    return Caller(make_key, "write")


def test_a_submission_records_one_event_on_the_route_and_on_the_lane(
    client: TestClient, runtime: Runtime, caller: Caller
) -> None:
    inline = {"name": "inline", "steps": [{"id": "one", "action": "noop"}]}
    first = _job(client, caller, inline)
    named = [_job(client, caller) for _ in range(3)]  # cached key and name: the lane and loop

    event = only(runtime, caller, "job.submit", f"job:{first}")
    assert event.source == "POST /v1/jobs"
    assert event.detail == {"pipeline": "inline"}
    trail = events(runtime, caller.owner)
    assert [e.target_id for e in trail] == [first, *named]
    assert {(e.action, e.source) for e in trail} == {("job.submit", "POST /v1/jobs")}


def test_a_replayed_idempotency_key_records_nothing_more(
    client: TestClient, runtime: Runtime, caller: Caller
) -> None:
    first = _job(client, caller, idempotency_key="once")
    again = _job(client, caller, idempotency_key="once")

    assert again == first
    only(runtime, caller, "job.submit", f"job:{first}")


def test_a_refused_change_records_nothing(
    client: TestClient, runtime: Runtime, caller: Caller, make_key: KeyFactory
) -> None:
    bad = client.post(
        "/v1/jobs", json={"pipeline": {"name": "x", "steps": []}}, headers=caller.headers
    )
    saved = client.put(
        "/v1/pipelines/broken",
        content="name: broken\nsteps: [{id: a, action: nope}]\n",
        headers={**caller.headers, "Content-Type": "application/yaml"},
    )
    job_id = _job(client, caller)
    reader = Caller(make_key, "read")
    forbidden = client.post(f"/v1/jobs/{job_id}/cancel", headers=reader.headers)

    assert (bad.status_code, saved.status_code, forbidden.status_code) == (422, 422, 403)
    assert [e.action for e in events(runtime, caller.owner)] == ["job.submit"]
    assert events(runtime, reader.owner) == []


def test_cancel_records_once_and_a_cancel_of_a_cancelled_job_records_nothing(
    client: TestClient, runtime: Runtime, caller: Caller
) -> None:
    job_id = _job(client, caller)
    for _ in range(2):
        assert client.post(f"/v1/jobs/{job_id}/cancel", headers=caller.headers).status_code == 200

    event = only(runtime, caller, "job.cancel", f"job:{job_id}")
    assert event.source == "POST /v1/jobs/{job_id}/cancel"


def test_a_rerun_is_recorded_against_the_job_it_reruns(
    client: TestClient, runtime: Runtime, caller: Caller
) -> None:
    job_id = _job(client, caller)
    client.post(f"/v1/jobs/{job_id}/cancel", headers=caller.headers)
    rerun = client.post(f"/v1/jobs/{job_id}/rerun", json={}, headers=caller.headers)
    assert rerun.status_code == 202, rerun.text

    event = only(runtime, caller, "job.rerun", f"job:{job_id}")
    assert event.detail == {"job_id": rerun.json()["job"]["id"], "from_step": None}


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_a_decision_names_the_step(
    client: TestClient, runtime: Runtime, caller: Caller, decision: str
) -> None:
    job_id = parked_job(client, caller.headers, runtime)
    url = f"/v1/jobs/{job_id}/steps/gate/{decision}"
    assert client.post(url, json={}, headers=caller.headers).status_code == 200

    event = only(runtime, caller, f"job.{decision}", f"job:{job_id}")
    assert event.detail == {"step_id": "gate"}


def test_a_signal_names_the_signal(client: TestClient, runtime: Runtime, caller: Caller) -> None:
    waiting = {"name": "w", "steps": [{"id": "s", "action": "noop", "wait_for": {"signal": "go"}}]}
    job_id = _job(client, caller, waiting)
    with unit_of_work(runtime.sessions) as session:
        key = StepKey(uuid.UUID(job_id), "s")
        assert claim_step(session, key, task_id="t", lease_s=30, now=utcnow()) is None
    sent = client.post(f"/v1/jobs/{job_id}/signals/go", json={}, headers=caller.headers)
    assert sent.status_code == 200, sent.text

    assert only(runtime, caller, "job.signal", f"job:{job_id}").detail == {"signal": "go"}


SAVED = GREET.replace("name: greet", "name: saved")


def _save(client: TestClient, caller: Caller, text: str = SAVED) -> int:
    yaml = {**caller.headers, "Content-Type": "application/yaml"}
    return client.put("/v1/pipelines/saved", content=text, headers=yaml).status_code


def test_pipeline_save_share_and_delete(
    client: TestClient, runtime: Runtime, caller: Caller
) -> None:
    assert [_save(client, caller), _save(client, caller)] == [201, 200]  # the same content
    shares = "/v1/pipelines/saved/shares/student"
    assert client.put(shares, headers=caller.headers).status_code == 200
    assert client.delete(shares, headers=caller.headers).status_code == 200
    assert client.delete("/v1/pipelines/saved", headers=caller.headers).status_code == 200

    saved = only(runtime, caller, "pipeline.save", "pipeline:saved")
    assert saved.source == "PUT /v1/pipelines/{name}"
    assert saved.detail == {"owner": caller.owner, "version": 1}
    for action in ("pipeline.share", "pipeline.unshare"):
        assert only(runtime, caller, action, "pipeline:saved").detail["grantee"] == "student"
    only(runtime, caller, "pipeline.delete", "pipeline:saved")


def test_an_import_records_where_from_and_an_unchanged_one_nothing(
    settings: Settings, runtime: Runtime, caller: Caller, tmp_path: Path
) -> None:
    (tmp_path / "mine.yaml").write_text(SAVED)
    with api_client(settings.model_copy(update={"import_dir": tmp_path}), runtime) as client:
        for _ in range(2):
            body = {"path": "mine.yaml"}
            answer = client.post("/v1/pipelines/import", json=body, headers=caller.headers)
            assert answer.status_code in (200, 201), answer.text

    event = only(runtime, caller, "pipeline.import", "pipeline:saved")
    assert event.source == "POST /v1/pipelines/import"
    assert event.detail == {"owner": caller.owner, "version": 1, "source": "mine.yaml"}


def test_schedule_create_update_and_delete_one_of_several(
    client: TestClient, runtime: Runtime, caller: Caller
) -> None:
    _save(client, caller)
    base, hourly = "/v1/pipelines/saved", {"cron": "0 * * * *", "params": {"who": "a"}}
    daily = {**hourly, "cron": "0 6 * * *"}
    made = client.put(f"{base}/schedule", json=hourly, headers=caller.headers).json()
    client.put(f"{base}/schedule", json=daily, headers=caller.headers)
    second = client.post(f"{base}/schedules", json={**daily, "name": "b"}, headers=caller.headers)
    client.put(f"{base}/schedules/b", json={**hourly, "name": "b"}, headers=caller.headers)
    assert client.delete(f"{base}/schedules/b", headers=caller.headers).status_code == 204

    first_id, second_id = made["schedule"]["id"], second.json()["schedule"]["id"]
    trail = [(e.action, e.target_id) for e in events(runtime, caller.owner)[1:]]
    assert trail == [
        ("schedule.create", first_id),
        ("schedule.update", first_id),
        ("schedule.create", second_id),
        ("schedule.update", second_id),
        ("schedule.delete", second_id),
    ]
    event = only(runtime, caller, "schedule.delete", f"schedule:{second_id}")
    assert event.source == "DELETE /v1/pipelines/{name}/schedules/{schedule}"
    assert event.detail == {"pipeline": "saved", "name": "b"}


def test_hook_changes_record_no_secret(
    client: TestClient, runtime: Runtime, make_key: KeyFactory
) -> None:
    admin = Caller(make_key, "admin")
    name = f"h-{uuid.uuid4().hex[:6]}"
    body = {"pipeline": "greet", "params": {"who": "a"}}
    created = client.put(f"/v1/hooks/{name}", json=body, headers=admin.headers)
    client.put(f"/v1/hooks/{name}", json={**body, "enabled": False}, headers=admin.headers)
    assert client.delete(f"/v1/hooks/{name}", headers=admin.headers).status_code == 204

    secret = created.json()["secret"]
    made = only(runtime, admin, "hook.create", f"hook:{name}")
    assert made.detail == {"pipeline": "greet", "enabled": True, "secret_set": True}
    assert secret not in str(made.detail)
    assert only(runtime, admin, "hook.update", f"hook:{name}").detail["enabled"] is False
    only(runtime, admin, "hook.delete", f"hook:{name}")


def test_the_trail_is_for_admin_keys_only(
    client: TestClient, make_key: KeyFactory, caller: Caller
) -> None:
    for scopes in (("read",), ("read", "write")):
        refused = client.get("/v1/audit", headers=Caller(make_key, *scopes).headers)
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "forbidden"
    assert client.get("/v1/audit").status_code == 401


def _arranged(runtime: Runtime, owner: str) -> list[datetime]:
    """Five events an hour apart, the newest an hour ago, as an operator's CLI would make."""
    now = utcnow()
    times = [now - timedelta(hours=h) for h in (5, 4, 3, 2, 1)]
    with unit_of_work(runtime.sessions) as session:
        session.execute(delete(AuditEventRow).where(AuditEventRow.owner == owner))
        for n, at in enumerate(times):
            actor = Actor("cli", "flowbeat jobs cancel", f"user{n % 2}-{owner}", owner)
            target = Target("job" if n < 3 else "pipeline", f"t{n}")
            record(session, actor, "job.cancel" if n < 3 else "pipeline.save", target, at=at)
    return times


def test_filters_and_pages_newest_first(
    client: TestClient, runtime: Runtime, make_key: KeyFactory
) -> None:
    admin = Caller(make_key, "admin")
    owner = f"ops-{uuid.uuid4().hex[:6]}"
    times = _arranged(runtime, owner)

    def ids(**query: Any) -> list[str]:
        answer = client.get("/v1/audit", params={"actor": owner, **query}, headers=admin.headers)
        assert answer.status_code == 200, answer.text
        return [e["target_id"] for e in answer.json()["events"]]

    assert ids() == ["t4", "t3", "t2", "t1", "t0"]
    assert ids(action="job") == ids(action="job.cancel") == ["t2", "t1", "t0"]
    assert ids(target="pipeline:") == ["t4", "t3"]
    assert ids(target="job:t1") == ids(target="t1") == ["t1"]
    assert ids(since=(times[3] - timedelta(seconds=1)).isoformat()) == ["t4", "t3"]
    assert ids(actor=f"user1-{owner}") == ["t3", "t1"]

    pages, cursor = [], None
    while True:
        params: dict[str, str | int] = {"actor": owner, "limit": 2}
        if cursor:
            params["cursor"] = cursor
        page = client.get("/v1/audit", params=params, headers=admin.headers).json()
        pages.append([e["target_id"] for e in page["events"]])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages == [["t4", "t3"], ["t2", "t1"], ["t0"]]


def test_a_bad_filter_is_an_invalid_query(client: TestClient, make_key: KeyFactory) -> None:
    admin = Caller(make_key, "admin")
    naive = datetime.now(UTC).replace(tzinfo=None).isoformat()
    for params, code in (
        ({"cursor": "nope"}, "invalid_cursor"),
        ({"since": naive}, "invalid_query"),
        ({"since": "yesterday"}, "invalid_query"),
        ({"limit": 0}, "invalid_query"),
    ):
        answer = client.get("/v1/audit", params=params, headers=admin.headers)
        assert (answer.status_code, answer.json()["error"]["code"]) == (400, code), params
