"""Notices of new result items: an event row in the settling transaction, then a signed webhook.

The settling transaction only queues the job id on its session; a task adapter sends it once
that transaction has committed, so a receiver never hears of a run PostgreSQL does not hold.
"""

import hashlib
import hmac
import json
import uuid
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import httpx
from sqlalchemy import insert, update
from sqlalchemy.orm import Session, sessionmaker

from service.catalogue.diffs import DiffCounts, DiffKind, diff_page
from service.platform import metrics
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from service.platform.egress import EgressPolicy, guarded_client
from service.platform.errors import EgressRefused, NotifyUrlInvalid
from service.platform.models import JobEventRow, JobRow
from service.platform.settings import Settings

QUEUED_KEY = "flowbeat.notices"
SIGNATURE_HEADER = "X-Flowbeat-Signature"
TIMESTAMP_HEADER = "X-Flowbeat-Timestamp"
DELIVERY_HEADER = "X-Flowbeat-Delivery"
MAX_URL_LENGTH = 2048


def validate_notify_url(url: str) -> str:
    """http or https to a named host, without credentials that would end up in logs."""
    parts = urlsplit(url)
    problem = None
    if len(url) > MAX_URL_LENGTH:
        problem = f"longer than {MAX_URL_LENGTH} characters"
    elif parts.scheme not in ("http", "https"):
        problem = "scheme must be http or https"
    elif not parts.hostname:
        problem = "no host"
    elif parts.username is not None or parts.password is not None:
        problem = "credentials are not allowed in the URL"
    if problem:
        raise NotifyUrlInvalid(f"notify_url is not usable: {problem}", {"notify_url": url})
    return url


NOTICE_OUTCOMES = ("notified", "notify_failed")
"""The events that end a notice of new items: delivered, or given up."""


def record_event(session: Session, job_id: uuid.UUID, kind: str, data: dict[str, Any]) -> None:
    session.execute(insert(JobEventRow).values(job_id=job_id, kind=kind, data=data))


def record_outcome(session: Session, job_id: uuid.UUID, kind: str, data: dict[str, Any]) -> None:
    """A delivery's outcome; the outcome of a notice of new items also ends its wait, in the
    same transaction, so the sweeper never sends a notice whose outcome is recorded."""
    record_event(session, job_id, kind, data)
    if kind in NOTICE_OUTCOMES:
        session.execute(update(JobRow).where(JobRow.id == job_id).values(notice_due_at=None))


def note_new_items(session: Session, job: JobRow, counts: DiffCounts) -> None:
    """A diff-mode run that found new items: an event now, a webhook after the commit."""
    record_event(
        session,
        job.id,
        "new_items",
        {
            "counts": counts.as_dict(),
            "previous_job_id": str(job.previous_job_id) if job.previous_job_id else None,
        },
    )
    if job.notify_url:
        job.notice_due_at = utcnow()
        session.info.setdefault(QUEUED_KEY, []).append(job.id)


def take_queued(session: Session) -> list[uuid.UUID]:
    queued: list[uuid.UUID] = session.info.pop(QUEUED_KEY, [])
    return queued


def sign(secret: bytes, delivery_id: str, timestamp: str, body: bytes) -> str:
    """HMAC-SHA256 over ``<delivery id>.<timestamp>.<body>``, the Standard Webhooks content: a
    captured delivery sent again under a new timestamp or a new delivery id fails."""
    signed = b".".join((delivery_id.encode(), timestamp.encode(), body))
    return f"sha256={hmac.new(secret, signed, hashlib.sha256).hexdigest()}"


@dataclass(frozen=True)
class Notice:
    url: str
    body: bytes
    delivery_id: str
    """The same for every attempt at one notice, so a receiver can drop a second copy."""


def build_notice(session: Session, job_id: uuid.UUID, items_max: int) -> Notice | None:
    job = session.get(JobRow, job_id)
    if job is None or not job.notify_url or job.item_count is None:
        return None
    first = diff_page(session, job, DiffKind.NEW, limit=items_max)
    payload = {
        "job_id": str(job.id),
        "pipeline": job.pipeline,
        "previous_job_id": str(job.previous_job_id) if job.previous_job_id else None,
        "counts": {
            "items": job.item_count,
            "new": job.new_count,
            "removed": job.removed_count,
        },
        "new_items": first.items,
        "more_new_items": first.next_cursor is not None,
    }
    body = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return Notice(url=job.notify_url, body=body, delivery_id=f"new_items-{job.id}")


@dataclass(frozen=True)
class Delivery:
    ok: bool
    retryable: bool
    detail: str
    code: str | None = None
    """The egress policy's refusal code, when it refused the URL."""

    def event_data(self, **data: Any) -> dict[str, Any]:
        coded = {} if self.code is None else {"code": self.code}
        return {**data, "detail": self.detail, **coded}


def notice_policy(settings: Settings, kind: str) -> EgressPolicy:
    """The egress policy of ``kind`` (``notice``, ``escalation``), with the notice timeout."""
    return replace(EgressPolicy.from_settings(settings, kind), timeout_s=settings.notify_timeout_s)


def deliver(notice: Notice, secret: bytes, timestamp: str, policy: EgressPolicy) -> Delivery:
    """One POST, no redirects, through the egress policy: 2xx is delivered, 5xx/429/timeouts
    may succeed later, a refused URL or address never will."""
    headers = {
        "Content-Type": "application/json",
        DELIVERY_HEADER: notice.delivery_id,
        TIMESTAMP_HEADER: timestamp,
        SIGNATURE_HEADER: sign(secret, notice.delivery_id, timestamp, notice.body),
    }
    try:
        with guarded_client(policy, follow_redirects=False) as client:
            response = client.post(notice.url, content=notice.body, headers=headers)
    except EgressRefused as exc:
        return Delivery(ok=False, retryable=False, detail=exc.message, code=exc.code)
    except httpx.HTTPError as exc:
        return Delivery(ok=False, retryable=True, detail=f"{type(exc).__name__}: {exc}")
    status = response.status_code
    if 200 <= status < 300:
        return Delivery(ok=True, retryable=False, detail=str(status))
    return Delivery(ok=False, retryable=status >= 500 or status == 429, detail=str(status))


def send_notice(
    sessions: sessionmaker[Session],
    settings: Settings,
    job_id: uuid.UUID,
    *,
    attempt: int,
    now_s: float,
) -> float | None:
    """Try one delivery. Returns the delay before the next attempt, or ``None`` when done.

    Delays double from ``notify_backoff_s``. The outcome, delivered or given up, is recorded
    as an event, so an owner can see a notice that never arrived.
    """
    with unit_of_work(sessions) as session:
        notice = build_notice(session, job_id, settings.notify_items_max)
    if notice is None:
        return None
    return try_delivery(
        sessions,
        settings,
        job_id,
        notice,
        sender="notice",
        kinds=NOTICE_OUTCOMES,
        attempt=attempt,
        now_s=now_s,
    )


def try_delivery(
    sessions: sessionmaker[Session],
    settings: Settings,
    job_id: uuid.UUID,
    notice: Notice,
    *,
    sender: str,
    kinds: tuple[str, str],
    attempt: int,
    now_s: float,
    **event: Any,
) -> float | None:
    """One signed delivery of any notice (new items, an escalation): the delay before the next
    attempt, or ``None`` once delivered or given up, recorded as ``kinds`` (ok, failed)."""
    if settings.webhook_secret is None:
        outcome = Delivery(ok=False, retryable=False, detail="FLOWBEAT_WEBHOOK_SECRET is not set")
    else:
        secret = settings.webhook_secret.get_secret_value().encode()
        outcome = deliver(notice, secret, str(int(now_s)), notice_policy(settings, sender))
    if not outcome.ok and outcome.retryable and attempt < settings.notify_max_attempts:
        metrics.NOTICE_DELIVERIES.labels(sender, "retried").inc()
        return float(settings.notify_backoff_s * 2 ** (attempt - 1))
    kind = kinds[0] if outcome.ok else kinds[1]
    with unit_of_work(sessions) as session:
        record_outcome(session, job_id, kind, outcome.event_data(**event, attempts=attempt))
    metrics.NOTICE_DELIVERIES.labels(sender, "delivered" if outcome.ok else "gave_up").inc()
    return None


def requeue_lost_notices(
    session: Session, *, older_than: datetime, now: datetime
) -> list[uuid.UUID]:
    """Jobs whose notice was due before ``older_than`` and has no outcome, nor a resend since:
    its task was lost (the worker died between the commit and queuing it, or the broker forgot
    it). Each is due again from ``now`` and gets a ``notice_resent`` event; the caller queues
    the notices after the commit. Only waiting notices are read (``JobRow.notice_due_at``)."""
    lost = list(
        session.scalars(
            update(JobRow)
            .where(JobRow.notice_due_at < older_than)
            .values(notice_due_at=now)
            .returning(JobRow.id)
        )
    )
    for job_id in lost:
        record_event(session, job_id, "notice_resent", {})
    return lost
