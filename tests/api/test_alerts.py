"""``/v1/alerts``: an owner's rules, refused whole when they cannot work, and the deliveries
each one queued; a rule from FLOWBEAT_ALERTS is shown and cannot be changed through the API."""

import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from service.alerts.offers import Candidate, Offered, offer
from service.alerts.rules import sync_settings_rules
from service.engine.runtime import Runtime
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from service.platform.models import AlertRuleRow, AuditEventRow
from service.platform.settings import AlertRuleSetting
from tests.api.conftest import KeyFactory

SECRET_NAME = "API_ALERT_KEY"
RULE = {"kind": "job_failed", "url": "https://hooks.example.com/a", "secret": SECRET_NAME}


@pytest.fixture(autouse=True)
def _signing_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(f"FLOWBEAT_SECRET_{SECRET_NAME}", "s3cret")


def _auth(make_key: KeyFactory, *scopes: str, owner: str | None = None) -> dict[str, str]:
    return {"Authorization": f"Bearer {make_key(*scopes, owner=owner)}"}


def _rules(runtime: Runtime) -> int:
    with runtime.sessions() as session:
        return session.scalar(select(func.count()).select_from(AlertRuleRow)) or 0


def test_a_rule_is_created_read_listed_replaced_and_deleted(
    client: TestClient, make_key: KeyFactory, runtime: Runtime
) -> None:
    owner = f"o-{uuid.uuid4().hex[:8]}"
    writer = _auth(make_key, "read", "write", owner=owner)

    created = client.put("/v1/alerts/failures", json=RULE, headers=writer)
    replaced = client.put(
        "/v1/alerts/failures", json={**RULE, "format": "slack", "dedupe_s": 60}, headers=writer
    )
    shown = client.get("/v1/alerts/failures", headers=writer)
    listed = client.get("/v1/alerts", headers=writer)
    deleted = client.delete("/v1/alerts/failures", headers=writer)
    gone = client.get("/v1/alerts/failures", headers=writer)

    assert (created.status_code, replaced.status_code) == (201, 200), created.text
    alert = shown.json()["alert"]
    assert (alert["owner"], alert["format"], alert["dedupe_s"], alert["source"]) == (
        owner,
        "slack",
        60,
        "api",
    )
    assert [a["name"] for a in listed.json()["alerts"]] == ["failures"]
    assert deleted.status_code == 204
    assert (gone.status_code, gone.json()["error"]["code"]) == (404, "alert_not_found")
    with runtime.sessions() as session:
        actions = session.scalars(
            select(AuditEventRow.action)
            .where(AuditEventRow.owner == owner, AuditEventRow.target_kind == "alert")
            .order_by(AuditEventRow.id)
        ).all()
    assert actions == ["alert.create", "alert.update", "alert.delete"]


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        ({**RULE, "kind": "step_retried"}, "alert_rule_invalid", "threshold"),
        ({**RULE, "threshold": 3}, "alert_rule_invalid", "threshold"),
        ({**RULE, "url": "ftp://hooks.example.com/a"}, "alert_rule_invalid", "url"),
        ({**RULE, "url": "http://10.0.0.8/a"}, "alert_rule_invalid", "url"),
        ({**RULE, "secret": "NOT_CONFIGURED"}, "alert_rule_invalid", "secret"),
        (
            {**RULE, "kind": "queue_age", "threshold": 5, "pipeline": "p"},
            "alert_rule_invalid",
            "pipeline",
        ),
        ({**RULE, "kind": "job_late"}, "validation_error", None),
        ({**RULE, "format": "teams"}, "validation_error", None),
        ({**RULE, "color": "red"}, "validation_error", None),
    ],
)
def test_a_rule_that_cannot_work_is_refused_and_nothing_is_stored(
    client: TestClient,
    make_key: KeyFactory,
    runtime: Runtime,
    body: dict[str, Any],
    code: str,
    field: str | None,
) -> None:
    before = _rules(runtime)

    answer = client.put("/v1/alerts/bad", json=body, headers=_auth(make_key, "write"))

    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["code"] == code
    if field is not None:
        assert error["details"]["field"] == field
    assert _rules(runtime) == before


def test_rules_are_per_owner_and_writing_needs_the_write_scope(
    client: TestClient, make_key: KeyFactory
) -> None:
    mine = _auth(make_key, "write")
    client.put("/v1/alerts/mine", json=RULE, headers=mine)

    other = client.get("/v1/alerts/mine", headers=_auth(make_key, "read"))
    reader = client.put("/v1/alerts/x", json=RULE, headers=_auth(make_key, "read"))
    nobody = client.get("/v1/alerts")

    assert other.status_code == 404
    assert reader.status_code == 403
    assert nobody.status_code == 401


def test_a_settings_rule_is_shown_and_refused_to_changes(
    client: TestClient, make_key: KeyFactory, runtime: Runtime
) -> None:
    owner = f"o-{uuid.uuid4().hex[:8]}"
    managed = AlertRuleSetting(name="ops", owner=owner, **RULE)
    with unit_of_work(runtime.sessions) as session:
        refused = sync_settings_rules(
            session, runtime.settings.model_copy(update={"alerts": [managed]})
        )
    writer = _auth(make_key, "read", "write", owner=owner)

    shown = client.get("/v1/alerts/ops", headers=writer)
    changed = client.put("/v1/alerts/ops", json=RULE, headers=writer)
    removed = client.delete("/v1/alerts/ops", headers=writer)

    assert refused == []
    assert shown.json()["alert"]["source"] == "settings"
    assert (changed.status_code, changed.json()["error"]["code"]) == (409, "alert_rule_managed")
    assert (removed.status_code, removed.json()["error"]["code"]) == (409, "alert_rule_managed")


def test_deliveries_are_listed_newest_first_a_page_at_a_time(
    client: TestClient, make_key: KeyFactory, runtime: Runtime
) -> None:
    owner = f"o-{uuid.uuid4().hex[:8]}"
    reader = _auth(make_key, "read", "write", owner=owner)
    client.put("/v1/alerts/paged", json={**RULE, "dedupe_s": 0}, headers=reader)
    with unit_of_work(runtime.sessions) as session:
        rule = session.scalar(
            select(AlertRuleRow).where(AlertRuleRow.owner == owner, AlertRuleRow.name == "paged")
        )
        assert rule is not None
        for n in range(3):
            candidate = Candidate(rule, f"event:{n}", f"pipeline:p{n}", f"failure {n}", {})
            offer(session, candidate, utcnow(), Offered())

    first = client.get("/v1/alerts/paged/deliveries?limit=2", headers=reader).json()
    rest = client.get(
        f"/v1/alerts/paged/deliveries?limit=2&before={first['next_before']}", headers=reader
    ).json()

    keys = [d["event_key"] for d in first["deliveries"] + rest["deliveries"]]
    assert keys == ["event:2", "event:1", "event:0"]
    shown = first["deliveries"][0]
    assert (shown["status"], shown["attempts"], shown["delivery_id"]) == (
        "pending",
        0,
        f"alert-{shown['id']}",
    )
    assert shown["event"]["summary"] == "failure 2"
    assert rest["next_before"] is None
