"""Rules on what did not happen: a schedule that started no job past a due fire, a queue
whose oldest message waited too long. A lasting condition is one event: it alerts once."""

import uuid
from datetime import timedelta

from service.alerts.conditions import check_queues, check_schedules
from service.engine.runtime import Runtime
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from service.platform.models import ScheduleRow
from tests.service.alerts.support import outbox, rule


def _schedule(rt: Runtime, owner: str, saved_ago_s: float) -> ScheduleRow:
    saved = utcnow() - timedelta(seconds=saved_ago_s)
    row = ScheduleRow(
        owner=owner,
        pipeline="nightly",
        every_s=60,
        timezone="UTC",
        params={},
        enabled=True,
        overlap="skip",
        catchup="none",
        catchup_window_s=0,
        jitter_s=0,
        diff_mode=False,
        created_at=saved,
        updated_at=saved,
    )
    with unit_of_work(rt.sessions) as session:
        session.add(row)
        session.flush()
        session.expunge(row)
    return row


def test_a_schedule_silent_past_its_threshold_alerts_once(runtime: Runtime) -> None:
    owner = f"o-{uuid.uuid4().hex[:8]}"
    silent = _schedule(runtime, owner, saved_ago_s=600)
    _schedule(runtime, owner, saved_ago_s=0)
    rule_id = rule(runtime, owner, kind="schedule_silent", threshold=120, dedupe_s=0).rule.id

    for _ in range(2):
        with unit_of_work(runtime.sessions) as session:
            check_schedules(session, utcnow())

    [queued] = outbox(runtime, rule_id)
    assert queued.subject == f"schedule:{silent.id}"
    assert queued.payload["last_started_at"] is None


def test_a_queue_older_than_the_threshold_alerts_once_per_oldest_message(
    runtime: Runtime,
) -> None:
    rule_id = rule(
        runtime, f"o-{uuid.uuid4().hex[:8]}", kind="queue_age", threshold=30, dedupe_s=0
    ).rule.id
    now = utcnow()
    stuck = now - timedelta(seconds=90)
    ages = {"default": stuck, "gpu": now - timedelta(seconds=5), "idle": None}

    for later_s in (0, 10):
        with unit_of_work(runtime.sessions) as session:
            check_queues(session, ages, now + timedelta(seconds=later_s))
    with unit_of_work(runtime.sessions) as session:
        check_queues(session, {"default": now - timedelta(seconds=40)}, now)

    queued = outbox(runtime, rule_id)
    assert [row.subject for row in queued] == ["queue:default", "queue:default"]
    assert queued[0].payload["age_s"] == 90.0
