"""Step logs: an attempt's captured lines written once it has run, and read back by cursor.

An attempt's lines go out in one statement on the claim connection, whose commits do not wait
for the disk: a log line is worth less than the fsync a checkpoint pays, and the checkpoint's
synchronous commit that follows flushes it anyway. A lane's batch of shards sends the lines of
all its attempts in one statement before the batch's checkpoint. An attempt that logged nothing
sends nothing. The lines are written before the outcome is recorded, so they carry the round the
step row is still in, and a failed, retried or cancelled attempt keeps them too. The same
statement notifies the event channel, so a follower of the job wakes as it would for an event.

A reader's cursor is the line ``id``, so within a job ids must be given in commit order, or a
follower that read past id 12 would never see the 11 that two shards' writes committed after it.
The statement takes a per-job advisory lock before its rows take their ids (the lock's scan is
the join's other side, read before any row is formed) and holds it until it commits: two
attempts of one job that write at the same instant take turns, one short write long.
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
    ), attempted AS (
        SELECT a.n, a.step_id, a.shard, a.attempt,
               COALESCE((SELECT r.round FROM step_runs AS r
                          WHERE r.job_id = %(job_id)s::uuid AND r.step_id = a.step_id
                            AND r.shard = a.shard), 1) AS round
          FROM unnest(%(step_ids)s::text[], %(shards)s::int[], %(attempts)s::int[])
               WITH ORDINALITY AS a(step_id, shard, attempt, n)
    ), kept AS (
        INSERT INTO step_logs
               (job_id, step_id, shard, attempt, round, seq, level, logger, ts, message)
        SELECT %(job_id)s::uuid, a.step_id, a.shard, a.attempt, a.round,
               line.seq, line.level, line.logger, line.ts, line.message
          FROM serialised,
               unnest(%(of)s::int[], %(seqs)s::int[], %(levels)s::text[], %(loggers)s::text[],
                      %(ts)s::timestamptz[], %(messages)s::text[])
               WITH ORDINALITY AS line(of, seq, level, logger, ts, message, place)
          JOIN attempted AS a ON a.n = line.of
         ORDER BY line.place
        RETURNING 1
    )
    SELECT pg_notify('{EVENTS_CHANNEL}', %(job_id)s::text) FROM (SELECT 1) AS one
     WHERE EXISTS (SELECT 1 FROM kept)"""


@dataclass(frozen=True)
class Said:
    """What one attempt logged, held with its step and attempt until it is written."""

    key: StepKey
    attempt: int
    lines: Sequence[Line]


def write_lines(conn: psycopg.Connection[Any], said: Sequence[Said]) -> None:
    """Every line of some attempts of one job in one statement, in the order given; none
    when they have none."""
    said = [one for one in said if one.lines]
    if not said:
        return
    lines = [(n, line) for n, one in enumerate(said, 1) for line in one.lines]
    conn.execute(
        _WRITE,
        {
            "job_id": said[0].key.job_id,
            "step_ids": [one.key.step_id for one in said],
            "shards": [one.key.shard for one in said],
            "attempts": [one.attempt for one in said],
            "of": [n for n, _ in lines],
            "seqs": [line.seq for _, line in lines],
            "levels": [line.level[:LEVEL_CHARS] for _, line in lines],
            "loggers": [line.logger for _, line in lines],
            "ts": [datetime.fromtimestamp(line.ts, UTC) for _, line in lines],
            "messages": [line.message.replace("\x00", "\ufffd") for _, line in lines],
        },
    )


def keep_lines(connections: DirectConnections, said: Sequence[Said]) -> None:
    """``write_lines``, for the step path: a database that fails it loses the attempts' log
    and says so in the worker's, rather than failing a step whose outcome can still be
    recorded (the recording fails on its own if the database is gone)."""
    count = sum(len(one.lines) for one in said)
    if not count:
        return
    try:
        with connections.connect() as conn:
            write_lines(conn, said)
    except (psycopg.Error, ValueError) as exc:
        log.warning("the step's log of %d lines was not kept: %s", count, exc)


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
