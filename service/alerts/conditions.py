"""Rules on something that did not happen: a schedule that started no job past a due fire,
a queue whose oldest message has waited too long. The beat leader checks them each pass; a
condition that lasts is one event (the missed fire, the message), so it alerts once."""

import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.alerts.offers import Candidate, Offered, offer
from service.language.cron import next_fire
from service.platform.models import AlertRuleRow, ScheduleFireRow, ScheduleRow
from service.triggers.schedules import timing_of


def _rules(session: Session, kind: str) -> list[AlertRuleRow]:
    return list(
        session.scalars(
            select(AlertRuleRow).where(AlertRuleRow.enabled.is_(True), AlertRuleRow.kind == kind)
        )
    )


def wants_queue_ages(session: Session) -> bool:
    """Whether any rule watches queues: reading them costs a pass over the broker."""
    return bool(_rules(session, "queue_age"))


def _last_started(session: Session, ids: list[uuid.UUID]) -> dict[uuid.UUID, datetime]:
    rows = session.execute(
        select(ScheduleFireRow.schedule_id, func.max(ScheduleFireRow.fire_at))
        .where(ScheduleFireRow.schedule_id.in_(ids), ScheduleFireRow.job_id.is_not(None))
        .group_by(ScheduleFireRow.schedule_id)
    )
    return {schedule_id: fire_at for schedule_id, fire_at in rows}


def check_schedules(session: Session, now: datetime) -> Offered:
    """A schedule is silent when the first fire due after the last one that started a job (or
    after it was last saved) is more than the rule's threshold in the past: beat down, fires
    failing, or every fire skipped behind a run that never ends."""
    offered = Offered()
    for rule in _rules(session, "schedule_silent"):
        query = select(ScheduleRow).where(
            ScheduleRow.owner == rule.owner, ScheduleRow.enabled.is_(True)
        )
        if rule.pipeline:
            query = query.where(ScheduleRow.pipeline == rule.pipeline)
        schedules = list(session.scalars(query))
        started = _last_started(session, [row.id for row in schedules])
        for row in schedules:
            since = max(started.get(row.id, row.updated_at), row.updated_at)
            expected = next_fire(timing_of(row), since)
            silent_s = (now - expected).total_seconds()
            if silent_s <= (rule.threshold or 0):
                continue
            label = f"{row.pipeline} ({row.name})" if row.name else row.pipeline
            summary = (
                f"schedule {label} has started no job since its fire due at "
                f"{expected.isoformat()} ({round(silent_s)}s ago)"
            )
            details = {
                "schedule_id": str(row.id),
                "pipeline": row.pipeline,
                "expected_at": expected.isoformat(),
                "last_started_at": started[row.id].isoformat() if row.id in started else None,
            }
            key = f"schedule:{row.id}:{expected.isoformat()}"
            offer(
                session, Candidate(rule, key, f"schedule:{row.id}", summary, details), now, offered
            )
    session.flush()
    return offered


def check_queues(session: Session, oldest: Mapping[str, datetime | None], now: datetime) -> Offered:
    """``oldest``: each queue's oldest waiting message's send time, read from the broker."""
    offered = Offered()
    for rule in _rules(session, "queue_age"):
        for queue, sent in sorted(oldest.items()):
            if sent is None or now - sent <= timedelta(seconds=rule.threshold or 0):
                continue
            age_s = round((now - sent).total_seconds(), 1)
            summary = f"queue {queue}: its oldest message has waited {age_s}s"
            details = {"queue": queue, "oldest_sent_at": sent.isoformat(), "age_s": age_s}
            key = f"queue:{queue}:{sent.isoformat()}"
            offer(session, Candidate(rule, key, f"queue:{queue}", summary, details), now, offered)
    session.flush()
    return offered
