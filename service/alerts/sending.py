"""Sending the outbox: signed webhooks, retried with backoff, each outcome on its row.

A worker claims a batch of due rows by pushing each one's next attempt past a lease long
enough for the requests ahead of it, and commits before it sends, so two workers never send
one row at once and a worker killed mid-send leaves the row to be claimed again once the lease
is over. Each attempt of a row carries the same delivery id (``alert-<id>``), so a receiver
can drop the copy a crash between its answer and our commit makes. Signing and the request
itself are the notices' (``service.catalogue.notices``).
"""

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from service.alerts.rules import EGRESS_KIND
from service.catalogue.notices import Delivery, Notice, deliver, notice_policy
from service.platform import metrics
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from service.platform.models import AlertDeliveryRow, AlertRuleRow
from service.platform.secrets import secrets_of
from service.platform.settings import Settings

SEND_BATCH = 20
PRUNE_BATCH = 1000
LEASE_TIMEOUTS = 3
"""A claimed row's lease: the request timeouts of the rows ahead of it in its batch, and this
many more; past it, its sender is taken for dead. While leased, a row is not due, so the beat
queues no second sender for a batch that waits on a slow receiver."""
PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"


@dataclass(frozen=True)
class Claimed:
    id: int
    kind: str
    owner: str
    secret: str | None
    notice: Notice


def body_of(rule: AlertRuleRow, row: AlertDeliveryRow, delivery_id: str) -> bytes:
    """``slack``: the ``text`` an incoming webhook shows; ``flowbeat``: the whole alert."""
    payload: dict[str, Any]
    if rule.format == "slack":
        payload = {"text": f"flowbeat alert {rule.name}: {row.payload['summary']}"}
    else:
        payload = {
            "alert": rule.name,
            "kind": rule.kind,
            "owner": rule.owner,
            "subject": row.subject,
            "delivery_id": delivery_id,
            "event": row.payload,
        }
    return json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()


def has_due(session: Session, now: datetime) -> bool:
    return (
        session.scalar(
            select(AlertDeliveryRow.id)
            .where(AlertDeliveryRow.status == PENDING, AlertDeliveryRow.next_attempt_at <= now)
            .limit(1)
        )
        is not None
    )


def claim_due(
    session: Session, now: datetime, *, timeout_s: float, limit: int = SEND_BATCH
) -> list[Claimed]:
    rows = session.execute(
        select(AlertDeliveryRow, AlertRuleRow)
        .join(AlertRuleRow, AlertRuleRow.id == AlertDeliveryRow.rule_id)
        .where(AlertDeliveryRow.status == PENDING, AlertDeliveryRow.next_attempt_at <= now)
        .order_by(AlertDeliveryRow.next_attempt_at)
        .limit(limit)
        .with_for_update(of=AlertDeliveryRow, skip_locked=True)
    ).all()
    claimed = []
    for place, (row, rule) in enumerate(rows):
        row.attempts += 1
        row.next_attempt_at = now + timedelta(seconds=(place + LEASE_TIMEOUTS) * timeout_s)
        delivery_id = row.delivery_id
        notice = Notice(url=rule.url, body=body_of(rule, row, delivery_id), delivery_id=delivery_id)
        claimed.append(Claimed(row.id, rule.kind, rule.owner, rule.secret, notice))
    session.flush()
    return claimed


def attempt(settings: Settings, claimed: Claimed, now_s: float) -> Delivery:
    """One POST. A secret that cannot be read now may be readable later: retried."""
    if claimed.secret is not None:
        secret = secrets_of(settings).value(claimed.secret, claimed.owner)
    elif settings.webhook_secret is not None:
        secret = settings.webhook_secret.get_secret_value()
    else:
        secret = None
    if secret is None:
        return Delivery(ok=False, retryable=True, detail="the signing secret is not configured")
    policy = notice_policy(settings, EGRESS_KIND)
    return deliver(claimed.notice, secret.encode(), str(int(now_s)), policy)


def record(
    session: Session, claimed: Claimed, outcome: Delivery, now: datetime, settings: Settings
) -> str | None:
    """The attempt's outcome on its row: ``delivered``, ``retried`` or ``gave_up``; ``None``
    when the row went with its rule meanwhile."""
    row = session.get(AlertDeliveryRow, claimed.id, with_for_update=True)
    if row is None or row.status != PENDING:
        return None
    if outcome.ok:
        row.status, row.delivered_at, row.last_error = DELIVERED, now, None
        return "delivered"
    row.last_error = outcome.detail if outcome.code is None else f"{outcome.code}: {outcome.detail}"
    if outcome.retryable and row.attempts < settings.alerts_max_attempts:
        backoff_s = settings.alerts_backoff_s * 2 ** (row.attempts - 1)
        row.next_attempt_at = now + timedelta(seconds=min(backoff_s, settings.alerts_backoff_max_s))
        return "retried"
    row.status = FAILED
    return "gave_up"


def send_due(
    sessions: sessionmaker[Session], settings: Settings, *, clock: Callable[[], datetime] = utcnow
) -> int:
    """Send what is due, a claimed batch at a time, until a batch comes back short; returns
    how many attempts were made."""
    made = 0
    while True:
        with unit_of_work(sessions) as session:
            batch = claim_due(session, clock(), timeout_s=settings.notify_timeout_s)
        for claimed in batch:
            outcome = attempt(settings, claimed, time.time())
            with unit_of_work(sessions) as session:
                label = record(session, claimed, outcome, clock(), settings)
            if label is not None:
                metrics.ALERTS.labels(claimed.kind, label).inc()
        made += len(batch)
        if len(batch) < SEND_BATCH:
            return made


def prune_deliveries(session: Session, before: datetime) -> int:
    """Delete up to ``PRUNE_BATCH`` finished deliveries queued before ``before``, oldest first;
    pending ones are kept whatever their age."""
    oldest = (
        select(AlertDeliveryRow.id)
        .where(AlertDeliveryRow.status != PENDING, AlertDeliveryRow.created_at < before)
        .order_by(AlertDeliveryRow.id)
        .limit(PRUNE_BATCH)
        .scalar_subquery()
    )
    gone = session.scalars(
        delete(AlertDeliveryRow)
        .where(AlertDeliveryRow.id.in_(oldest))
        .returning(AlertDeliveryRow.id)
    ).all()
    return len(gone)
