"""The audit trail: who changed what, through which channel, and when.

A change records itself in the caller's transaction (``record`` only executes an INSERT; the
route or command that owns the transaction commits it), so a refused or rolled-back change
leaves no row and a row always names a change that happened. A job submission records itself
inside the statement that stores the job (``service.engine.submission``), so the hot path pays
no round trip for it. Details stay small: names, ids and flags, never secrets, profiles or
params.
"""

import base64
import getpass
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal
from urllib.parse import urlsplit

from sqlalchemy import and_, delete, func, insert, or_, select
from sqlalchemy.orm import Session

from service.platform.auth import Principal
from service.platform.clock import utcnow
from service.platform.constants import (
    API_KEY_PREFIX,
    AUDIT_DETAIL_MAX_BYTES,
    RETENTION_BATCH_ROWS,
    SWEEP_ADVISORY_LOCK_ID,
)
from service.platform.errors import AuditQueryInvalid, InvalidCursor
from service.platform.models import AuditEventRow, JobRow, ScheduleRow

Channel = Literal["api", "cli", "mcp", "ui"]
CLI_ACTOR = "cli"
"""The actor of a command whose OS user cannot be read (no passwd entry, no LOGNAME)."""


@dataclass(frozen=True)
class Actor:
    """Who makes a change and how: ``actor`` is the key's prefix on the API, MCP and the
    dashboard, the OS user on the CLI; ``owner`` is the owner it acts as; ``source`` the route
    (``POST /v1/jobs/{job_id}/cancel``) or command (``flowbeat jobs cancel``)."""

    channel: Channel
    source: str
    actor: str
    owner: str

    @classmethod
    def of_key(cls, principal: Principal, channel: Channel, source: str) -> "Actor":
        return cls(channel, source, principal.prefix, principal.owner)

    @classmethod
    def of_cli(cls, command: str, owner: str) -> "Actor":
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = CLI_ACTOR
        return cls("cli", f"flowbeat {command}", user or CLI_ACTOR, owner)


@dataclass(frozen=True)
class Target:
    kind: str
    id: str


def record_cancel(session: Session, actor: Actor, job: JobRow, now: datetime) -> None:
    """Only a cancel that ended the job now (``cancel_job`` stamps ``now``) is a change;
    cancelling a cancelled job changes nothing and records nothing."""
    if job.finished_at == now:
        record(session, actor, "job.cancel", Target("job", str(job.id)), at=now)


def record_rerun(session: Session, actor: Actor, job: JobRow, from_step: str | None) -> None:
    """A rerun is recorded against the job it reruns, naming the job it made."""
    detail = {"job_id": str(job.id), "from_step": from_step}
    record(session, actor, "job.rerun", Target("job", str(job.parent_job_id)), detail)


def record_decision(
    session: Session,
    actor: Actor,
    job_id: uuid.UUID,
    step_id: str,
    *,
    approve: bool,
    by: str | None = None,
) -> None:
    """``by``: the name a command recorded the decision under, when it is not the actor's."""
    action = "job.approve" if approve else "job.reject"
    detail = {"step_id": step_id} if by is None else {"step_id": step_id, "by": by}
    record(session, actor, action, Target("job", str(job_id)), detail)


def record_signal(
    session: Session, actor: Actor, job_id: uuid.UUID, name: str, *, by: str | None = None
) -> None:
    detail = {"signal": name} if by is None else {"signal": name, "by": by}
    record(session, actor, "job.signal", Target("job", str(job_id)), detail)


def record_key(session: Session, actor: Actor, action: str, key: str, **detail: Any) -> None:
    """A key is named by its prefix, never by its text, even when the command was given it."""
    prefix = key.removeprefix(API_KEY_PREFIX).partition("_")[0]
    record(session, actor, action, Target("key", prefix), detail)


def saved_event(
    name: str, owner: str, version: int | None, source: str | None = None
) -> tuple[Target, dict[str, Any]]:
    """A pipeline saved as a new version; an import names where from, without a query string
    or credentials, which may hold secrets."""
    detail: dict[str, Any] = {"owner": owner, "version": version}
    if source is not None:
        parts = urlsplit(source)
        detail["source"] = (
            f"{parts.scheme}://{parts.hostname}{parts.path}" if parts.scheme else source
        )
    return Target("pipeline", name), detail


def schedule_event(row: ScheduleRow) -> tuple[Target, dict[str, Any]]:
    return Target("schedule", str(row.id)), {"pipeline": row.pipeline, "name": row.name}


def schedule_saved(row: ScheduleRow, now: datetime) -> str:
    """A save stamps ``now`` on the row it creates (``created_at``) and on every row it writes."""
    return "schedule.create" if row.created_at == now else "schedule.update"


def record_schedule_state(session: Session, actor: Actor, row: ScheduleRow, now: datetime) -> None:
    """A pause or resume that changed the schedule (it stamps ``now``); one that found it
    already so changed nothing and records nothing."""
    if row.updated_at == now:
        action = "schedule.resume" if row.enabled else "schedule.pause"
        record(session, actor, action, *schedule_event(row), at=now)


def small(detail: Mapping[str, Any] | None) -> dict[str, Any]:
    """A detail over ``AUDIT_DETAIL_MAX_BYTES`` as JSON is replaced by a note saying so: the
    trail says what changed, it is not a copy of it."""
    if not detail:
        return {}
    size = len(json.dumps(detail, default=str))
    if size > AUDIT_DETAIL_MAX_BYTES:
        return {"omitted": f"detail of {size} bytes"}
    return json.loads(json.dumps(detail, default=str))  # type: ignore[no-any-return]


def record(
    session: Session,
    actor: Actor,
    action: str,
    target: Target,
    detail: Mapping[str, Any] | None = None,
    *,
    at: datetime | None = None,
) -> None:
    """One row in the caller's transaction; the caller commits it with its change."""
    session.execute(
        insert(AuditEventRow).values(
            at=at or utcnow(),
            channel=actor.channel,
            source=actor.source,
            actor=actor.actor,
            owner=actor.owner,
            action=action,
            target_kind=target.kind,
            target_id=target.id,
            detail=small(detail),
        )
    )


def audit_columns(actor: Actor | None) -> dict[str, str | None]:
    """What a job's row in the submission statement carries for ``submit_events``; all null
    (no event) when the submitter is not audited (a schedule, a hook, a trigger)."""
    if actor is None:
        return {"audit_channel": None, "audit_source": None, "audit_actor": None}
    return {
        "audit_channel": actor.channel,
        "audit_source": actor.source,
        "audit_actor": actor.actor,
    }


def submit_events(values: str, joined: str) -> str:
    """A CTE recording ``job.submit`` for each job the statement's ``new_job`` stored: in the
    job's own statement, so it costs no round trip and exists exactly when the job does.
    ``values``: at, channel, source, actor, owner, pipeline and version, from ``joined``."""
    return f""", audited AS (
        INSERT INTO audit_events (at, channel, source, actor, owner, action, target_kind,
                                  target_id, detail)
        SELECT at, channel, source, actor, owner, 'job.submit', 'job', id::text,
               jsonb_strip_nulls(jsonb_build_object('pipeline', pipeline, 'version', version))
          FROM (SELECT new_job.id, {values} FROM {joined})
               AS e(id, at, channel, source, actor, owner, pipeline, version)
    )"""


@dataclass(frozen=True)
class AuditQuery:
    """``target``: ``kind:id``, ``kind:`` (every target of a kind) or an id or name alone.
    ``actor``: a key prefix, an OS user or an owner. ``action``: ``job.cancel``, or ``job``
    for every action on jobs."""

    target: str | None = None
    actor: str | None = None
    action: str | None = None
    since: datetime | None = None
    limit: int = 50
    cursor: str | None = None


def _encode_cursor(row: AuditEventRow) -> str:
    raw = f"{row.at.isoformat()}|{row.id}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[datetime, int]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        at, row_id = raw.split("|")
        return datetime.fromisoformat(at), int(row_id)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidCursor("cursor is not one this API returned", {"cursor": cursor}) from exc


def _filters(query: AuditQuery) -> list[Any]:
    row = AuditEventRow
    where: list[Any] = []
    if query.target:
        kind, colon, target_id = query.target.partition(":")
        if not colon:
            where.append(row.target_id == query.target)
        elif target_id:
            where.append(and_(row.target_kind == kind, row.target_id == target_id))
        else:
            where.append(row.target_kind == kind)
    if query.actor:
        where.append(or_(row.actor == query.actor, row.owner == query.actor))
    if query.action:
        if "." in query.action:
            where.append(row.action == query.action)
        else:
            where.append(row.action.startswith(f"{query.action}.", autoescape=True))
    if query.since is not None:
        if query.since.tzinfo is None:
            raise AuditQueryInvalid("since needs a time zone", {"param": "since"})
        where.append(row.at >= query.since)
    return where


def list_events(session: Session, query: AuditQuery) -> tuple[list[AuditEventRow], str | None]:
    """Newest first, keyset-paged on (at, id) so pages hold still while changes are recorded."""
    row = AuditEventRow
    statement = (
        select(row)
        .where(*_filters(query))
        .order_by(row.at.desc(), row.id.desc())
        .limit(query.limit + 1)
    )
    if query.cursor:
        at, row_id = _decode_cursor(query.cursor)
        statement = statement.where(or_(row.at < at, and_(row.at == at, row.id < row_id)))
    events = list(session.scalars(statement))
    more = len(events) > query.limit
    return events[: query.limit], _encode_cursor(events[query.limit - 1]) if more else None


def prune_events(
    session: Session, now: datetime, retention_days: float, *, batch: int = RETENTION_BATCH_ROWS
) -> int:
    """Delete up to ``batch`` events older than ``retention_days``, oldest first, under the
    sweeper's advisory lock (taken again if the pass holds it already), so two beat replicas
    never delete the same rows; a pass that finds more leaves the rest to the next one."""
    if not session.scalar(select(func.pg_try_advisory_xact_lock(SWEEP_ADVISORY_LOCK_ID))):
        return 0
    cutoff = now - timedelta(days=retention_days)
    doomed = (
        select(AuditEventRow.id)
        .where(AuditEventRow.at < cutoff)
        .order_by(AuditEventRow.at, AuditEventRow.id)
        .limit(batch)
    )
    deleted = session.scalars(
        delete(AuditEventRow).where(AuditEventRow.id.in_(doomed)).returning(AuditEventRow.id)
    )
    return len(deleted.all())
