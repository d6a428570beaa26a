"""The outbox is sent as signed webhooks: a failed attempt waits its backoff and is sent again
under the same delivery id, a refused URL is given up at once, a Slack rule sends a body Slack
takes, and a row is claimed by one sender at a time."""

import json
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from pydantic import SecretStr

from service.alerts.offers import Candidate, Offered, offer
from service.alerts.sending import claim_due, prune_deliveries, send_due
from service.engine.runtime import Runtime
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from service.platform.metrics import registry
from service.platform.models import AlertRuleRow
from service.platform.settings import Settings
from tests.service.alerts.support import SECRET, outbox, rule
from tests.support.webhook import WebhookServer


def _queued(rt: Runtime, url: str, settings: Settings | None = None, **body: Any) -> uuid.UUID:
    saved = rule(rt, f"o-{uuid.uuid4().hex[:8]}", url=url, settings=settings, dedupe_s=0, **body)
    with unit_of_work(rt.sessions) as session:
        row = session.get(AlertRuleRow, saved.rule.id)
        assert row is not None
        candidate = Candidate(row, "event:1", "pipeline:p", "job j of p failed", {"job_id": "j"})
        offer(session, candidate, utcnow(), Offered())
    return saved.rule.id


def _clock(offset_s: list[float]) -> Callable[[], datetime]:
    return lambda: utcnow() + timedelta(seconds=offset_s[0])


def _settings(rt: Runtime, **changes: object) -> Settings:
    quick = {"alerts_backoff_s": 30.0, "alerts_max_attempts": 3, **changes}
    return rt.settings.model_copy(update=quick)


def test_a_failed_attempt_is_sent_again_after_its_backoff_under_the_same_delivery_id(
    runtime: Runtime,
) -> None:
    delivered = {"kind": "job_failed", "outcome": "delivered"}
    before = registry().get_sample_value("flowbeat_alerts_total", delivered) or 0.0
    with WebhookServer([500, 200]) as hook:
        rule_id = _queued(runtime, hook.url)
        offset = [0.0]
        settings = _settings(runtime)

        send_due(runtime.sessions, settings, clock=_clock(offset))
        [waiting] = outbox(runtime, rule_id)
        send_due(runtime.sessions, settings, clock=_clock(offset))
        offset[0] = 31.0
        send_due(runtime.sessions, settings, clock=_clock(offset))
        received = hook.received

    [sent] = outbox(runtime, rule_id)
    assert (waiting.status, waiting.attempts, waiting.last_error) == ("pending", 1, "500")
    assert (sent.status, sent.attempts, sent.last_error) == ("delivered", 2, None)
    assert registry().get_sample_value("flowbeat_alerts_total", delivered) == before + 1
    assert len(received) == 2
    assert {got.headers["X-Flowbeat-Delivery"] for got in received} == {f"alert-{sent.id}"}
    assert all(got.signed_with(SECRET) for got in received)
    body = json.loads(received[1].body)
    assert (body["kind"], body["subject"], body["event"]["job_id"]) == (
        "job_failed",
        "pipeline:p",
        "j",
    )


def test_attempts_stop_at_the_limit(runtime: Runtime) -> None:
    with WebhookServer([503]) as hook:
        rule_id = _queued(runtime, hook.url)
        offset = [0.0]
        for step in range(4):
            offset[0] = step * 1000.0
            send_due(runtime.sessions, _settings(runtime), clock=_clock(offset))

    [given_up] = outbox(runtime, rule_id)
    assert (given_up.status, given_up.attempts) == ("failed", 3)


def test_a_url_the_egress_policy_refuses_is_given_up_at_once(runtime: Runtime) -> None:
    with WebhookServer([200]) as hook:
        rule_id = _queued(runtime, hook.url)
        closed = _settings(runtime, egress_internal_hosts=[])
        send_due(runtime.sessions, closed)
        received = hook.received

    [refused] = outbox(runtime, rule_id)
    assert received == []
    assert refused.status == "failed" and refused.attempts == 1
    assert refused.last_error is not None and refused.last_error.startswith("egress_")


def test_a_slack_rule_sends_text_signed_with_the_deployment_secret(runtime: Runtime) -> None:
    with WebhookServer([200]) as hook:
        settings = _settings(runtime, webhook_secret=SecretStr("deployment-secret"))
        rule_id = _queued(runtime, hook.url, settings, format="slack", secret=None)
        send_due(runtime.sessions, settings)
        [got] = hook.received

    assert json.loads(got.body) == {"text": "flowbeat alert on-failure: job j of p failed"}
    assert got.signed_with("deployment-secret")
    assert outbox(runtime, rule_id)[0].status == "delivered"


def test_a_claimed_row_is_not_claimed_again_until_its_lease_is_over(runtime: Runtime) -> None:
    rule_id = _queued(runtime, "http://127.0.0.1:9/never")
    now = utcnow()
    with unit_of_work(runtime.sessions) as session:
        first = [c.id for c in claim_due(session, now, timeout_s=10, limit=1000)]
    with unit_of_work(runtime.sessions) as session:
        again = [c.id for c in claim_due(session, now, timeout_s=10, limit=1000)]
    with unit_of_work(runtime.sessions) as session:
        after = [
            c.id for c in claim_due(session, now + timedelta(seconds=31), timeout_s=10, limit=1000)
        ]

    [row] = outbox(runtime, rule_id)
    assert row.id in first and row.id not in again and row.id in after


def test_finished_deliveries_past_the_cutoff_are_pruned_and_pending_ones_kept(
    runtime: Runtime,
) -> None:
    with WebhookServer([200]) as hook:
        sent = _queued(runtime, hook.url)
        send_due(runtime.sessions, _settings(runtime))
    pending = _queued(runtime, "http://127.0.0.1:9/never")

    with unit_of_work(runtime.sessions) as session:
        prune_deliveries(session, utcnow() + timedelta(seconds=1))

    assert outbox(runtime, sent) == []
    assert len(outbox(runtime, pending)) == 1
