"""Reading a job's event log, which the triggers of migration 0011 and the step path's own
statements write; a row of the latter holds every event of its statement (ADR 20), and is
unfolded here, so that readers get one event at a time.

The log is the source of truth for every stream: a reader remembers the last ``seq`` it saw
per job and asks for what follows, so a lost notification or a reconnect costs a read, never
an event. Event numbers are given in commit order, so "after n" never skips a late commit.
"""

import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, and_, not_, or_, select
from sqlalchemy.orm import Session

from service.platform.constants import EVENT_PAGE_ROWS
from service.platform.models import CompensationRow, JobEventRow, JobRow
from service.platform.states import JOB_FINAL, CompensationStatus

STATE_KINDS = ("job.", "step.", "approval.", "compensation.")
"""Kinds written by the triggers, one per state change; the rest are notices (``new_items``,
``notified``...) appended by the code that has something to tell."""


@dataclass(frozen=True)
class Event:
    job_id: uuid.UUID
    seq: int
    kind: str
    step_id: str | None
    data: dict[str, Any]
    at: datetime

    def public(self) -> dict[str, Any]:
        return {
            "job_id": str(self.job_id),
            "seq": self.seq,
            "kind": self.kind,
            "step_id": self.step_id,
            "data": self.data,
            "at": self.at.isoformat(),
        }


def _events(row: JobEventRow) -> list[Event]:
    """The events of one row, in order: those its statement logged before the last
    (``more``, ADR 20), then the one in its columns, numbered up to its ``seq``."""
    assert row.seq is not None
    earlier = row.more or []
    first = row.seq - len(earlier)
    return [
        *(
            Event(row.job_id, first + i, e["kind"], e["step_id"], e["data"], row.created_at)
            for i, e in enumerate(earlier)
        ),
        Event(row.job_id, row.seq, row.kind, row.step_id, row.data, row.created_at),
    ]


def _numbered() -> ColumnElement[bool]:
    return JobEventRow.seq.is_not(None)


def _of_job(
    session: Session,
    job_id: uuid.UUID,
    after: int,
    limit: int | None,
    kinds: ColumnElement[bool] | None = None,
    keep: Callable[[str], bool] = lambda _: True,
) -> list[Event]:
    """The job's events past ``after`` whose kind ``keep`` takes, at most ``limit``, read a
    page of rows at a time. ``kinds`` is ``keep`` in SQL: a row whose statement logged more
    than one event is read whatever its own kind, and its events are sorted out here."""
    events: list[Event] = []
    while limit is None or len(events) < limit:
        query = (
            select(JobEventRow)
            .where(JobEventRow.job_id == job_id, JobEventRow.seq > after, _numbered())
            .order_by(JobEventRow.seq)
        )
        if kinds is not None:
            query = query.where(or_(kinds, JobEventRow.more.is_not(None)))
        rows = list(session.scalars(query if limit is None else query.limit(limit)))
        events += [e for row in rows for e in _events(row) if e.seq > after and keep(e.kind)]
        if limit is None or len(rows) < limit:
            break
        after = rows[-1].seq or after
    return events if limit is None else events[:limit]


def events_after(
    session: Session, job_id: uuid.UUID, after: int, limit: int = EVENT_PAGE_ROWS
) -> list[Event]:
    return _of_job(session, job_id, after, limit)


def _state_change(kind: str) -> bool:
    return kind.startswith(STATE_KINDS)


def _step_change(kind: str) -> bool:
    return kind.startswith("step.") and kind != "step.progress"


def step_history(session: Session, job_id: uuid.UUID, limit: int) -> list[Event]:
    """Every state change of the job's steps, without the fan-out's per-item progress, which
    a job of 10,000 items writes 10,000 of."""
    steps = and_(JobEventRow.kind.startswith("step."), JobEventRow.kind != "step.progress")
    return _of_job(session, job_id, 0, limit, steps, _step_change)


def notice_events(session: Session, job_id: uuid.UUID) -> list[Event]:
    """The events that are not state changes, in order: what a job had to tell its owner."""
    state = or_(*(JobEventRow.kind.startswith(prefix) for prefix in STATE_KINDS))
    return _of_job(session, job_id, 0, None, not_(state), lambda kind: not _state_change(kind))


def events_since(
    session: Session,
    *,
    owner: str | None,
    pipeline: str | None,
    since: datetime,
    limit: int = EVENT_PAGE_ROWS,
) -> list[Event]:
    """Events of the jobs ``owner`` may read (every job for ``None``) from ``since`` on."""
    rows = session.scalars(
        select(JobEventRow)
        .join(JobRow, JobRow.id == JobEventRow.job_id)
        .where(JobEventRow.created_at >= since, _numbered(), *_scope(owner, pipeline))
        .order_by(JobEventRow.created_at, JobEventRow.id)
        .limit(limit)
    )
    return [event for row in rows for event in _events(row)]


def events_of_jobs(
    session: Session,
    seen: dict[uuid.UUID, int],
    job_ids: Iterable[uuid.UUID],
    *,
    owner: str | None,
    pipeline: str | None,
    since: datetime,
) -> list[Event]:
    """What is new in ``job_ids`` past the last number ``seen`` of each, within the scope."""
    ids = list(job_ids)
    if not ids:
        return []
    newer = [
        and_(JobEventRow.job_id == job_id, JobEventRow.seq > seen[job_id])
        if job_id in seen
        else and_(JobEventRow.job_id == job_id, JobEventRow.created_at >= since)
        for job_id in ids
    ]
    rows = session.scalars(
        select(JobEventRow)
        .join(JobRow, JobRow.id == JobEventRow.job_id)
        .where(or_(*newer), _numbered(), *_scope(owner, pipeline))
        .order_by(JobEventRow.job_id, JobEventRow.seq)
    )
    return [
        event
        for row in rows
        for event in _events(row)
        if event.job_id not in seen or event.seq > seen[event.job_id]
    ]


def _scope(owner: str | None, pipeline: str | None) -> Sequence[ColumnElement[bool]]:
    where: list[ColumnElement[bool]] = []
    if owner is not None:
        where.append(JobRow.owner == owner)
    if pipeline is not None:
        where.append(JobRow.pipeline == pipeline)
    return where


def job_settled(session: Session, job_id: uuid.UUID) -> bool:
    """Whether nothing more will happen to the job: it is final and no compensation is open.

    A failed job still runs its compensations, whose events a stream waits for.
    """
    status = session.scalar(select(JobRow.status).where(JobRow.id == job_id))
    if status is None:
        return True
    if status not in JOB_FINAL:
        return False
    open_undo = session.scalar(
        select(CompensationRow.step_id)
        .where(
            CompensationRow.job_id == job_id,
            CompensationRow.status.in_([CompensationStatus.PENDING, CompensationStatus.RUNNING]),
        )
        .limit(1)
    )
    return open_undo is None
