"""The event log read by cursor, for the rules that match events.

The matcher reads ``job_events`` past the last id it saw, in one transaction with the outbox
rows it writes and the cursor it moves, so each event is matched exactly once. Ids are taken
when an event is inserted, not when its transaction commits: a reader can see id 101 before
id 100 commits. So an id the read skips over is kept as a gap, with the ``xmax`` of a snapshot
taken after the read: every transaction that could still commit that id has an xid below it,
so once the oldest transaction still running (``pg_snapshot_xmin``) is past it, the gap is
final: either read by then or never to be (a rollback). The event triggers number the job
(taking an xid) before inserting its event, so no event of a state change takes its id before
its transaction has an xid. No trigger is added: the log's writers pay nothing for alerts.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import islice
from typing import Any

from sqlalchemy import Row, func, or_, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from service.alerts.offers import Candidate, Offered, offer
from service.alerts.rules import EVENT_KINDS
from service.engine.deadlines import JOB_TIMEOUT
from service.platform.models import AlertCursorRow, AlertRuleRow, JobEventRow, JobRow

CURSOR_ID = 1
EVENT_BATCH = 2000
MAX_GAPS = 10_000
"""Beyond this many unread ids (a flood of rolled-back transactions), the oldest are let go."""
LOG_KINDS = ("job.failed", "approval.escalated", "step.retrying")


@dataclass(frozen=True)
class LogEvent:
    id: int
    """Its row's: a row holds every event its statement logged (ADR 20)."""
    key: str
    """Its own among all events: the row's id, and for an event before the row's last its
    place in ``more``, so that each event is offered once."""
    kind: str
    job_id: str
    step_id: str | None
    data: dict[str, Any]
    at: datetime
    owner: str | None
    pipeline: str | None

    @classmethod
    def all_of(cls, row: Row[Any]) -> list["LogEvent"]:
        earlier = [
            cls(
                row.id,
                f"{row.id}:{place}",
                e["kind"],
                str(row.job_id),
                e["step_id"],
                e["data"] or {},
                row.created_at,
                row.owner,
                row.pipeline,
            )
            for place, e in enumerate(row.more or [])
        ]
        last = cls(
            row.id,
            str(row.id),
            row.kind,
            str(row.job_id),
            row.step_id,
            row.data or {},
            row.created_at,
            row.owner,
            row.pipeline,
        )
        return [*earlier, last]


def _cursor(session: Session) -> AlertCursorRow:
    """Locked for the pass; on first use it starts at the end of the log: rules alert on what
    happens from now on."""
    latest = select(func.coalesce(func.max(JobEventRow.id), 0)).scalar_subquery()
    session.execute(
        insert(AlertCursorRow)
        .values(id=CURSOR_ID, last_event_id=latest, gaps=[])
        .on_conflict_do_nothing(index_elements=["id"])
    )
    cursor = session.get(AlertCursorRow, CURSOR_ID, with_for_update=True, populate_existing=True)
    assert cursor is not None
    return cursor


def _event_rules(session: Session) -> list[AlertRuleRow]:
    return list(
        session.scalars(
            select(AlertRuleRow).where(
                AlertRuleRow.enabled.is_(True), AlertRuleRow.kind.in_(sorted(EVENT_KINDS))
            )
        )
    )


def _read(session: Session, after: int, gaps: Sequence[int], limit: int) -> list[LogEvent]:
    rows = session.execute(
        select(
            JobEventRow.id,
            JobEventRow.kind,
            JobEventRow.job_id,
            JobEventRow.step_id,
            JobEventRow.data,
            JobEventRow.more,
            JobEventRow.created_at,
            JobRow.owner,
            JobRow.pipeline,
        )
        .outerjoin(JobRow, JobRow.id == JobEventRow.job_id)
        .where(or_(JobEventRow.id > after, JobEventRow.id.in_(list(gaps))))
        .order_by(JobEventRow.id)
        .limit(limit)
    )
    return [event for row in rows for event in LogEvent.all_of(row)]


def _horizon(session: Session) -> tuple[int, int]:
    """(xmin, xmax) of a snapshot taken now: every xid below xmin has finished."""
    row = session.execute(
        text(
            "SELECT pg_snapshot_xmin(s)::text::bigint, pg_snapshot_xmax(s)::text::bigint "
            "FROM pg_current_snapshot() AS s"
        )
    ).one()
    return int(row[0]), int(row[1])


def _advance(cursor: AlertCursorRow, found: set[int], xmin: int, xmax: int) -> None:
    """Past the newest id read; an id skipped over is kept with ``xmax`` until ``xmin`` passes
    it, and a gap read now or final by then is let go."""
    last = cursor.last_event_id
    newest = max((i for i in found if i > last), default=last)
    kept = [gap for gap in cursor.gaps if gap[0] not in found and gap[1] > xmin]
    skipped = islice(([i, xmax] for i in range(last + 1, newest) if i not in found), MAX_GAPS)
    cursor.gaps = (kept + list(skipped))[-MAX_GAPS:]
    cursor.last_event_id = newest


def match_events(session: Session, now: datetime, *, limit: int = EVENT_BATCH) -> Offered:
    """One pass over the log past the cursor: every rule-matching event into the outbox."""
    offered = Offered()
    cursor = _cursor(session)
    rules = _event_rules(session)
    if not rules:
        latest = session.scalar(select(func.max(JobEventRow.id)))
        cursor.last_event_id = max(cursor.last_event_id, latest or 0)
        cursor.gaps = []
        return offered
    events = _read(session, cursor.last_event_id, [gap[0] for gap in cursor.gaps], limit)
    _advance(cursor, {event.id for event in events}, *_horizon(session))
    offered.more = len(events) >= limit
    for event in events:
        if event.kind in LOG_KINDS and event.owner is not None:
            for rule in rules:
                candidate = candidate_of(rule, event)
                if candidate is not None:
                    offer(session, candidate, now, offered)
    session.flush()
    return offered


def candidate_of(rule: AlertRuleRow, event: LogEvent) -> Candidate | None:
    """What ``rule`` makes of ``event``: ``None`` when it is not the rule's."""
    if event.owner != rule.owner or (rule.pipeline and rule.pipeline != event.pipeline):
        return None
    error = event.data.get("error") or {}
    timed_out = event.kind == "job.failed" and error.get("code") == JOB_TIMEOUT
    job = {"job_id": event.job_id, "pipeline": event.pipeline, "event_at": event.at.isoformat()}
    key = f"event:{event.key}"
    if rule.kind == "job_failed" and event.kind == "job.failed":
        summary = f"job {event.job_id} of {event.pipeline} failed: {error.get('message', '')}"
        return Candidate(rule, key, f"pipeline:{event.pipeline}", summary, {**job, "error": error})
    if rule.kind == "deadline_passed" and timed_out:
        summary = f"job {event.job_id} of {event.pipeline} passed its deadline"
        return Candidate(rule, key, f"pipeline:{event.pipeline}", summary, {**job, "error": error})
    if rule.kind == "approval_escalated" and event.kind == "approval.escalated":
        summary = f"approval of step {event.step_id} of job {event.job_id} escalated"
        subject = f"approval:{event.job_id}:{event.step_id}"
        return Candidate(rule, key, subject, summary, {**job, "step_id": event.step_id})
    attempt = int(event.data.get("attempt") or 0)
    threshold = rule.threshold or 0
    if rule.kind == "step_retried" and event.kind == "step.retrying" and attempt > threshold:
        summary = (
            f"step {event.step_id} of job {event.job_id} ({event.pipeline}) retried {attempt} times"
        )
        details = {**job, "step_id": event.step_id, "retries": attempt, "error": error}
        return Candidate(rule, key, f"step:{event.pipeline}:{event.step_id}", summary, details)
    return None
