"""Approval timeouts are carried out by the elected beat replica, not by a sleeping task."""

import json
import uuid

from service.engine.events import notice_events
from service.platform.db import unit_of_work
from service.platform.models import ApprovalRow
from tests.e2e.conftest import Client, Cluster, wait_for
from tests.e2e.test_approvals import gated
from tests.support.webhook import WebhookServer

SECRET = "escalation-secret"
FAST_BEAT = {"beat_lock_ttl_s": "1.5"}


def _events(client: Client, job_id: uuid.UUID) -> list[str]:
    with unit_of_work(client.rt.sessions) as session:
        return [event.kind for event in notice_events(session, job_id)]


def _approval(client: Client, job_id: uuid.UUID) -> ApprovalRow:
    with unit_of_work(client.rt.sessions) as session:
        approval = session.get(ApprovalRow, (job_id, "ship"))
        assert approval is not None
        return approval


def test_a_gate_that_times_out_with_auto_approve_goes_on(cluster: Cluster, client: Client) -> None:
    cluster.worker()
    cluster.beat(**FAST_BEAT)

    job_id = client.submit(gated(timeout_s=1, on_timeout="auto_approve"))
    done = client.wait_final(job_id, timeout_s=30)

    assert done.job.status == "succeeded", done.job.error
    approval = _approval(client, job_id)
    assert (approval.status, approval.decided_by) == ("approved", "system:timeout")
    assert client.count(job_id, "ship") == 1


def test_an_escalated_gate_sends_a_signed_notice_then_rejects(
    cluster: Cluster, client: Client
) -> None:
    cluster.worker(webhook_secret=SECRET)
    cluster.beat(**FAST_BEAT)
    with WebhookServer([200]) as hook:
        profile = gated(
            timeout_s=1, on_timeout="escalate", escalate_after_s=2, escalate_to=hook.url
        )
        job_id = client.submit(profile)
        done = client.wait_final(job_id, timeout_s=30)
        wait_for(lambda: "escalation_notified" in _events(client, job_id), 30, "the notice")
        [notice] = hook.received

    assert done.job.status == "failed"
    assert {s.step_id: s.status for s in done.steps}["ship"] == "rejected"
    approval = _approval(client, job_id)
    assert approval.escalated_at is not None and approval.decided_by == "system:timeout"
    body = json.loads(notice.body)
    assert (body["event"], body["job_id"], body["step_id"]) == (
        "approval_escalated",
        str(job_id),
        "ship",
    )
    assert notice.signed_with(SECRET)
    assert notice.headers["X-Flowbeat-Delivery"] == f"escalation-{job_id}-ship"
    kinds = _events(client, job_id)
    assert kinds.index("awaiting_approval") < kinds.index("approval_escalated")
    assert kinds.index("approval_escalated") < kinds.index("approval_decided")
