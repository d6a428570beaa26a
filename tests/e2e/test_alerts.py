"""An alert on real processes: a job fails, the beat leader queues its alert in PostgreSQL, a
worker sends it to a receiver that answers 500 twice, the broker is SIGKILLed and started
again empty between the attempts, and the alert still arrives exactly once accepted, signed,
under one delivery id; nothing is sent after it."""

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from service.alerts.rules import delete_rule, put_rule
from service.platform.auth import create_api_key
from service.platform.db import unit_of_work
from service.platform.models import AlertDeliveryRow, AlertRuleRow
from service.platform.settings import AlertRuleBody
from tests.e2e.conftest import Client, Cluster, wait_for
from tests.support.redis_server import RedisServer
from tests.support.webhook import Received, WebhookServer

OWNER = "tests"
SECRET_NAME = "E2E_ALERT_KEY"
SECRET = "e2e-alert-signing-secret"
QUIET_S = 3.0
"""How long the receiver is watched after the delivery for a copy: several alert passes."""


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    yield server
    server.stop()


def _failing(name: str) -> dict[str, Any]:
    step = {"id": "only", "action": "drill.fail_on", "with": {"name": name, "value": 1, "bad": [1]}}
    return {"name": name, "steps": [step]}


def _rule(client: Client, pipeline: str, url: str) -> AlertRuleRow:
    body = AlertRuleBody(
        kind="job_failed", url=url, secret=SECRET_NAME, pipeline=pipeline, dedupe_s=0
    )
    with unit_of_work(client.rt.sessions) as session:
        saved = put_rule(session, f"e2e-{pipeline}", body, owner=OWNER, settings=client.settings)
        session.expunge(saved.rule)
    return saved.rule


def _deliveries(client: Client, rule: AlertRuleRow) -> list[AlertDeliveryRow]:
    with unit_of_work(client.rt.sessions) as session:
        rows = list(
            session.scalars(select(AlertDeliveryRow).where(AlertDeliveryRow.rule_id == rule.id))
        )
        session.expunge_all()
        return rows


def _delivered(client: Client, rule: AlertRuleRow) -> AlertDeliveryRow | None:
    return next((row for row in _deliveries(client, rule) if row.status == "delivered"), None)


def _submit(base: str, client: Client, pipeline: dict[str, Any]) -> str:
    with unit_of_work(client.rt.sessions) as session:
        key, _ = create_api_key(session, owner=OWNER, scopes=["write"])
    answer = httpx.post(
        f"{base}/v1/jobs",
        json={"pipeline": pipeline, "params": {}},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert answer.status_code == 202, answer.text
    job_id: str = answer.json()["job"]["id"]
    return job_id


def test_an_alert_is_delivered_once_through_a_broker_restart_and_two_failed_attempts(
    client: Client,
    cluster: Cluster,
    private_redis: RedisServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pipeline = f"alerted-{uuid.uuid4().hex[:6]}"
    monkeypatch.setenv(f"FLOWBEAT_SECRET_{SECRET_NAME}", SECRET)
    cluster.env[f"FLOWBEAT_SECRET_{SECRET_NAME}"] = SECRET
    quick = {
        "broker_url": f"redis://127.0.0.1:{private_redis.port}/0",
        "alerts_interval_s": "0.3",
        "alerts_backoff_s": "1",
        "beat_lock_ttl_s": "1.5",
    }
    with WebhookServer([500, 500, 200]) as hook:
        rule = _rule(client, pipeline, hook.url)
        try:
            base = cluster.api(**quick)
            cluster.beat(**quick)
            cluster.worker(concurrency=1, **quick)
            job_id = _submit(base, client, _failing(pipeline))
            wait_for(lambda: hook.received, 60, "the first attempt")

            private_redis.restart()
            before_restart = len(hook.received)
            wait_for(lambda: len(hook.received) >= 3, 90, "two more attempts after the restart")
            delivered = wait_for(lambda: _delivered(client, rule), 30, "the delivery's record")
            time.sleep(QUIET_S)
            received = hook.received
            rows = _deliveries(client, rule)
        finally:
            with unit_of_work(client.rt.sessions) as session:
                delete_rule(session, rule.name, OWNER)

    assert before_restart < 3, "the restart came after the last attempt"
    assert len(received) == 3
    assert [row.id for row in rows] == [delivered.id], "one outbox row for the one event"
    assert delivered.attempts == 3 and delivered.last_error is None
    assert {got.headers["X-Flowbeat-Delivery"] for got in received} == {f"alert-{delivered.id}"}
    assert all(got.signed_with(SECRET) for got in received)
    accepted: Received = received[-1]
    body = json.loads(accepted.body)
    assert (body["alert"], body["kind"], body["subject"]) == (
        f"e2e-{pipeline}",
        "job_failed",
        f"pipeline:{pipeline}",
    )
    assert body["event"]["job_id"] == job_id
