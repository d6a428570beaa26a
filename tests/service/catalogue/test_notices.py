"""Notices: a signed webhook for runs with new items, retried with backoff, outcome recorded."""

import json
import uuid
from datetime import datetime, timedelta

import pytest
from pydantic import SecretStr

from service.catalogue.notices import (
    record_outcome,
    requeue_lost_notices,
    send_notice,
    sign,
    validate_notify_url,
)
from service.engine.events import notice_events
from service.engine.runtime import Runtime
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from service.platform.errors import NotifyUrlInvalid
from service.platform.metrics import registry
from service.platform.models import JobRow
from service.platform.settings import Settings
from tests.support.runs import run_items
from tests.support.webhook import Received, WebhookServer

SECRET = "test-secret"


def _settings(rt: Runtime, **overrides: object) -> Settings:
    return rt.settings.model_copy(
        update={"webhook_secret": SecretStr(SECRET), "notify_backoff_s": 0.5, **overrides}
    )


def _verified(got: Received) -> dict[str, object]:
    assert got.signed_with(SECRET)
    payload: dict[str, object] = json.loads(got.body)
    return payload


def _events(rt: Runtime, job_id: uuid.UUID) -> list[tuple[str, dict[str, object]]]:
    with unit_of_work(rt.sessions) as session:
        return [(event.kind, event.data) for event in notice_events(session, job_id)]


def _diff_run(rt: Runtime, notify_url: str) -> JobRow:
    """A diff run of one item, new to its owner, whose notice goes to ``notify_url``."""
    return run_items(
        rt,
        [{"id": "a"}],
        owner=f"notices-{uuid.uuid4().hex[:8]}",
        pipeline="n",
        diff_mode=True,
        notify_url=notify_url,
    )


def _deliveries() -> dict[str, float]:
    """``flowbeat_notice_deliveries_total`` of notices, by outcome."""
    return {
        outcome: registry().get_sample_value(
            "flowbeat_notice_deliveries_total", {"kind": "notice", "outcome": outcome}
        )
        or 0.0
        for outcome in ("delivered", "retried", "gave_up")
    }


def _moved(before: dict[str, float]) -> dict[str, float]:
    return {outcome: value - before[outcome] for outcome, value in _deliveries().items()}


def test_a_notice_is_signed_and_retried_after_a_503(runtime: Runtime) -> None:
    owner = f"notices-{uuid.uuid4().hex[:8]}"
    counted = _deliveries()
    with WebhookServer([503, 200]) as hook:
        run_items(runtime, [{"id": "a"}], owner=owner, pipeline="n", diff_mode=True)
        job = run_items(
            runtime,
            [{"id": "a"}, {"id": "b"}, {"id": "c"}],
            owner=owner,
            pipeline="n",
            diff_mode=True,
            notify_url=hook.url,
        )
        settings = _settings(runtime, notify_items_max=1)

        first = send_notice(runtime.sessions, settings, job.id, attempt=1, now_s=1000.0)
        second = send_notice(runtime.sessions, settings, job.id, attempt=2, now_s=1001.0)

    assert first == 0.5 and second is None
    assert len(hook.received) == 2
    assert {got.headers["X-Flowbeat-Delivery"] for got in hook.received} == {f"new_items-{job.id}"}
    payload = _verified(hook.received[1])
    assert payload == {
        "job_id": str(job.id),
        "pipeline": "n",
        "previous_job_id": str(job.previous_job_id),
        "counts": {"items": 3, "new": 2, "removed": 0},
        "new_items": [{"id": "b"}],
        "more_new_items": True,
    }
    assert [kind for kind, _ in _events(runtime, job.id)] == ["new_items", "notified"]
    assert _moved(counted) == {"delivered": 1, "retried": 1, "gave_up": 0}


def test_backoff_doubles_and_the_notice_is_given_up_after_the_last_attempt(
    runtime: Runtime,
) -> None:
    with WebhookServer([503]) as hook:
        job = _diff_run(runtime, hook.url)
        settings = _settings(runtime, notify_max_attempts=3)
        counted = _deliveries()
        delays = [
            send_notice(runtime.sessions, settings, job.id, attempt=n, now_s=1000.0)
            for n in (1, 2, 3)
        ]

    assert delays == [0.5, 1.0, None]
    assert len(hook.received) == 3
    kinds = _events(runtime, job.id)
    assert kinds[-1] == ("notify_failed", {"attempts": 3, "detail": "503"})
    assert _moved(counted) == {"delivered": 0, "retried": 2, "gave_up": 1}


def test_a_4xx_answer_is_not_retried(runtime: Runtime) -> None:
    with WebhookServer([404]) as hook:
        job = _diff_run(runtime, hook.url)
        delay = send_notice(runtime.sessions, _settings(runtime), job.id, attempt=1, now_s=0.0)

    assert delay is None
    assert _events(runtime, job.id)[-1][0] == "notify_failed"


@pytest.mark.parametrize(
    ("closed", "code"),
    [
        ({"egress_internal_hosts": []}, "egress_address_refused"),
        ({"egress_allow_http": False}, "egress_scheme_refused"),
    ],
)
def test_a_notice_the_egress_policy_refuses_is_recorded_with_its_code_and_not_retried(
    runtime: Runtime, closed: dict[str, object], code: str
) -> None:
    with WebhookServer([200]) as hook:
        job = _diff_run(runtime, hook.url)
        settings = _settings(runtime, **closed)
        delay = send_notice(runtime.sessions, settings, job.id, attempt=1, now_s=0.0)

    assert delay is None and hook.received == []
    kind, data = _events(runtime, job.id)[-1]
    assert (kind, data["code"], data["attempts"]) == ("notify_failed", code, 1)


def test_without_a_secret_nothing_is_sent_and_the_failure_is_recorded(runtime: Runtime) -> None:
    with WebhookServer([200]) as hook:
        job = _diff_run(runtime, hook.url)
        settings = _settings(runtime, webhook_secret=None)
        delay = send_notice(runtime.sessions, settings, job.id, attempt=1, now_s=0.0)

    assert delay is None and hook.received == []
    kind, data = _events(runtime, job.id)[-1]
    assert kind == "notify_failed" and "FLOWBEAT_WEBHOOK_SECRET" in str(data["detail"])


def test_the_signature_covers_the_delivery_id_and_the_timestamp() -> None:
    assert sign(b"k", "d-1", "1", b"{}") != sign(b"k", "d-1", "2", b"{}")
    assert sign(b"k", "d-1", "1", b"{}") != sign(b"k", "d-2", "1", b"{}")
    assert sign(b"k", "d-1", "1", b"{}").startswith("sha256=")


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.org/hook",
        "https://user:secret@example.org/hook",
        "https://user@example.org/hook",
        "https:///hook",
        "example.org/hook",
        "https://example.org/" + "x" * 3000,
    ],
)
def test_unusable_notify_urls_are_refused(url: str) -> None:
    with pytest.raises(NotifyUrlInvalid):
        validate_notify_url(url)


@pytest.mark.parametrize("url", ["https://hooks.example.org/x?a=1", "http://127.0.0.1:8080/h"])
def test_http_and_https_urls_are_accepted(url: str) -> None:
    assert validate_notify_url(url) == url


def test_a_notice_whose_task_was_lost_is_requeued_once_per_resend_period(
    runtime: Runtime,
) -> None:
    owner = f"notices-{uuid.uuid4().hex[:8]}"
    run_items(runtime, [{"id": "a"}], owner=owner, pipeline="lost", diff_mode=True)
    job = run_items(
        runtime,
        [{"id": "a"}, {"id": "b"}],
        owner=owner,
        pipeline="lost",
        diff_mode=True,
        notify_url="https://hooks.example.org/x",
    )
    due = utcnow()

    def requeued(older_than: datetime) -> bool:
        with unit_of_work(runtime.sessions) as session:
            return job.id in requeue_lost_notices(session, older_than=older_than, now=due)

    assert not requeued(due - timedelta(hours=1))
    assert requeued(due + timedelta(seconds=1))
    assert not requeued(due)
    with unit_of_work(runtime.sessions) as session:
        record_outcome(session, job.id, "notified", {})
    assert not requeued(due + timedelta(hours=1))
    kinds = [kind for kind, _ in _events(runtime, job.id)]
    assert kinds == ["new_items", "notice_resent", "notified"]


@pytest.mark.parametrize(("answers", "outcome"), [([200], "notified"), ([404], "notify_failed")])
def test_a_notice_with_an_outcome_is_never_resent_and_one_still_retrying_is(
    runtime: Runtime, answers: list[int], outcome: str
) -> None:
    with WebhookServer([503, *answers]) as hook:
        job = _diff_run(runtime, hook.url)
        settings = _settings(runtime)
        later = utcnow() + timedelta(hours=1)
        assert send_notice(runtime.sessions, settings, job.id, attempt=1, now_s=0.0) == 0.5
        with unit_of_work(runtime.sessions) as session:
            assert requeue_lost_notices(session, older_than=later, now=later) == [job.id]
        assert send_notice(runtime.sessions, settings, job.id, attempt=2, now_s=0.0) is None

    assert _events(runtime, job.id)[-1][0] == outcome
    with unit_of_work(runtime.sessions) as session:
        assert requeue_lost_notices(session, older_than=later + timedelta(days=1), now=later) == []
