"""What a rule matched, into the outbox: once per event, and once per subject per window."""

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from service.platform import metrics
from service.platform.models import AlertDeliveryRow, AlertRuleRow


@dataclass(frozen=True)
class Candidate:
    """``event_key`` names the event (a log entry, a missed fire, a queue's oldest message):
    the outbox takes one row per (rule, event_key). ``subject`` is what the dedupe window is
    kept per: a pipeline, a step, a schedule, a queue."""

    rule: AlertRuleRow
    event_key: str
    subject: str
    summary: str
    details: dict[str, Any]

    def payload(self, at: datetime) -> dict[str, Any]:
        return {"summary": self.summary, "at": at.isoformat(), **self.details}


@dataclass
class Offered:
    queued: int = 0
    suppressed: int = 0
    more: bool = False
    """The pass stopped at its batch size: there is more to read now."""

    def add(self, other: "Offered") -> None:
        self.queued += other.queued
        self.suppressed += other.suppressed


def offer(session: Session, candidate: Candidate, now: datetime, offered: Offered) -> None:
    """Queue ``candidate`` unless its rule already alerted on its subject within the rule's
    dedupe window: then that alert counts one more event it stands for. The caller holds the
    matcher's cursor lock, so no two offers race on one window."""
    rule = candidate.rule
    if rule.dedupe_s > 0:
        recent = session.scalar(
            select(AlertDeliveryRow)
            .where(
                AlertDeliveryRow.rule_id == rule.id,
                AlertDeliveryRow.subject == candidate.subject,
                AlertDeliveryRow.created_at > now - timedelta(seconds=rule.dedupe_s),
            )
            .order_by(AlertDeliveryRow.created_at.desc())
            .limit(1)
            .with_for_update()
        )
        if recent is not None:
            if recent.event_key != candidate.event_key:
                recent.suppressed += 1
                offered.suppressed += 1
                metrics.ALERTS.labels(rule.kind, "suppressed").inc()
            return
    stored = session.execute(
        insert(AlertDeliveryRow)
        .values(
            rule_id=rule.id,
            event_key=candidate.event_key,
            subject=candidate.subject,
            payload=candidate.payload(now),
            next_attempt_at=now,
            created_at=now,
        )
        .on_conflict_do_nothing(index_elements=["rule_id", "event_key"])
        .returning(AlertDeliveryRow.id)
    ).scalar()
    if stored is not None:
        offered.queued += 1
        metrics.ALERTS.labels(rule.kind, "queued").inc()
