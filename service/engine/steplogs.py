"""Step logs: an attempt's captured lines written once it has run, and read back by cursor.

An attempt's lines go out in one statement on the claim connection, whose commits do not
wait for the disk: a log line is worth less than the fsync a checkpoint pays, and the
checkpoint's synchronous commit that follows flushes it anyway. An attempt that logged nothing
sends nothing. The lines are written before the outcome is recorded, so they carry the round
the step row is still in, and a failed, retried or cancelled attempt keeps them too. The same
statement notifies the event channel, so a follower of the job wakes as it would for an event.

A reader's cursor is the line ``id``, so within a job ids must be given in commit order, or a
follower that read past id 12 would never see the 11 that two shards' writes committed after
it. The statement takes a per-job advisory lock before its rows take their ids (the lock's
scan is the join's other side, read before any row is formed) and holds it until it commits:
two attempts of one job that write at the same instant take turns, one short write long.
"""

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.engine.jobs import get_job
from service.engine.steps import StepKey
from service.language.snapshots import job_profile
from service.platform.capture import Line
from service.platform.constants import EVENTS_CHANNEL, SHARD_NONE, STEP_LOGS_LOCK_SPACE
from service.platform.db import DirectConnections
from service.platform.errors import StepNotFound
from service.platform.models import StepLogRow

log = logging.getLogger(__name__)

LEVEL_CHARS = 16
"""The width of ``step_logs.level``: a custom level's longer name is cut to it, not refused."""

_WRITE = f"""
    WITH serialised AS MATERIALIZED (
        SELECT pg_advisory_xact_lock({STEP_LOGS_LOCK_SPACE}, hashtext(%(job_id)s::text))
    ), kept AS (
        INSERT INTO step_logs
               (job_id, step_id, shard, attempt, round, seq, level, logger, ts, message)
        SELECT %(job_id)s::uuid, %(step_id)s::text, %(shard)s::int, %(attempt)s::int,
               COALESCE((SELECT round FROM step_runs
                          WHERE job_id = %(job_id)s::uuid AND step_id = %(step_id)s::text
                            AND shard = %(shard)s::int), 1),
               line.seq, line.level, line.logger, line.ts, line.message
          FROM serialised,
               unnest(%(seqs)s::int[], %(levels)s::text[], %(loggers)s::text[],
                      %(ts)s::timestamptz[], %(messages)s::text[])
               AS line(seq, level, logger, ts, message)
        RETURNING 1
    )
    SELECT pg_notify('{EVENTS_CHANNEL}', %(job_id)s::text) FROM (SELECT 1) AS one
     WHERE EXISTS (SELECT 1 FROM kept)"""


def write_lines(
    conn: psycopg.Connection[Any], key: StepKey, attempt: int, lines: Sequence[Line]
) -> None:
    """Every line of one attempt in one statement; none when it has none."""
    if not lines:
        return
    conn.execute(
        _WRITE,
        {
            "job_id": key.job_id,
            "step_id": key.step_id,
            "shard": key.shard,
            "attempt": attempt,
            "seqs": [line.seq for line in lines],
            "levels": [line.level[:LEVEL_CHARS] for line in lines],
            "loggers": [line.logger for line in lines],
            "ts": [datetime.fromtimestamp(line.ts, UTC) for line in lines],
            "messages": [line.message.replace("\x00", "\ufffd") for line in lines],
        },
    )


def keep_lines(
    connections: DirectConnections, key: StepKey, attempt: int, lines: Sequence[Line]
) -> None:
    """``write_lines``, for the step path: a database that fails it loses the attempt's log
    and says so in the worker's, rather than failing a step whose outcome can still be
    recorded (the recording fails on its own if the database is gone)."""
    if not lines:
        return
    try:
        with connections.connect() as conn:
            write_lines(conn, key, attempt, lines)
    except (psycopg.Error, ValueError) as exc:
        log.warning("the step's log of %d lines was not kept: %s", len(lines), exc)


@dataclass(frozen=True)
class LogLine:
    id: int
    step_id: str
    shard: int | None
    attempt: int
    round: int
    seq: int
    level: str
    logger: str
    ts: datetime
    message: str

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "step_id": self.step_id,
            "shard": self.shard,
            "attempt": self.attempt,
            "round": self.round,
            "seq": self.seq,
            "level": self.level,
            "logger": self.logger,
            "ts": self.ts.isoformat(),
            "message": self.message,
        }


def _line(row: StepLogRow) -> LogLine:
    return LogLine(
        id=row.id,
        step_id=row.step_id,
        shard=None if row.shard == SHARD_NONE else row.shard,
        attempt=row.attempt,
        round=row.round,
        seq=row.seq,
        level=row.level,
        logger=row.logger,
        ts=row.ts,
        message=row.message,
    )


@dataclass(frozen=True)
class LogTail:
    lines: list[LogLine]
    total: int


def tail_lines(session: Session, job_id: uuid.UUID, per_step: int) -> dict[str, LogTail]:
    """The last ``per_step`` lines of each step of a job that logged anything, oldest first,
    and how many it has in all. Counting reads the job's entries of the index, which holds
    no message; only the tail's rows are read from the table."""
    ranked = (
        select(
            StepLogRow.id,
            func.row_number()
            .over(partition_by=StepLogRow.step_id, order_by=StepLogRow.id.desc())
            .label("from_end"),
            func.count().over(partition_by=StepLogRow.step_id).label("total"),
        )
        .where(StepLogRow.job_id == job_id)
        .subquery()
    )
    rows = session.execute(
        select(StepLogRow, ranked.c.total)
        .join(ranked, ranked.c.id == StepLogRow.id)
        .where(ranked.c.from_end <= per_step)
        .order_by(StepLogRow.id)
    ).all()
    tails: dict[str, LogTail] = {}
    for row, total in rows:
        tails.setdefault(row.step_id, LogTail([], total)).lines.append(_line(row))
    return tails


def read_lines(
    session: Session,
    job_id: uuid.UUID,
    *,
    step_id: str | None = None,
    attempt: int | None = None,
    after: int = 0,
    limit: int,
) -> list[LogLine]:
    """A job's lines (one step's, one attempt's) after the line ``after``, oldest first: in
    the order their attempts' writes committed (``_WRITE``), so a follower misses none."""
    query = select(StepLogRow).where(StepLogRow.job_id == job_id, StepLogRow.id > after)
    if step_id is not None:
        query = query.where(StepLogRow.step_id == step_id)
    if attempt is not None:
        query = query.where(StepLogRow.attempt == attempt)
    rows = session.scalars(query.order_by(StepLogRow.id).limit(limit)).all()
    return [_line(row) for row in rows]


def step_lines(
    session: Session,
    job_id: uuid.UUID,
    step_id: str,
    *,
    owner: str | None,
    attempt: int | None = None,
    after: int = 0,
    limit: int,
) -> list[LogLine]:
    """One step's lines, as a reader whose keys see ``owner``'s jobs (every owner's for
    ``None``) may read them: ``job_not_found``, ``job_expired`` or ``step_not_found`` else."""
    job = get_job(session, job_id, owner=owner)
    if all(step.id != step_id for step in job_profile(job).steps):
        raise StepNotFound(
            f"job {job_id} has no step {step_id!r}", {"job_id": str(job_id), "step_id": step_id}
        )
    return read_lines(session, job_id, step_id=step_id, attempt=attempt, after=after, limit=limit)
