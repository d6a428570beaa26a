"""Leases on steps and on compensations: taken, checked, renewed and released here only.

A lease (a token and an expiry) makes one worker the holder of a step or a compensation while
its action runs. Whoever records an outcome must still hold it, so that a worker that lost its
lease, to a peer that took over once it lapsed, records nothing; a worker that died leaves an
expiry behind for the next delivery, or the sweeper, to act on. A step's lease is taken by the
claim statements (``TAKE_LEASE``), a compensation's by ``take_compensation``, and both are kept
alive by the same renewal.
"""

import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

import psycopg
from sqlalchemy import ColumnElement, Select, select, update
from sqlalchemy.orm import InstrumentedAttribute, Session

from service.engine.steps import Lease, ShardClaim, StepKey
from service.platform.errors import StopChain
from service.platform.models import OPEN_SHARD_PREDICATE, CompensationRow, JobRow, StepRunRow
from service.platform.states import (
    JOB_FINAL,
    STEP_DUE_SQL,
    CompensationStatus,
    JobStatus,
    StepStatus,
    row_test,
    sql_in,
)

TAKE_LEASE = f"""status = '{StepStatus.RUNNING}', attempts = s.attempts + 1,
               lease_token = %(token)s,
               lease_until = %(until)s, task_id = %(task_id)s, started_at = %(now)s,
               error = NULL"""
"""What a claim statement sets on the step row ``s`` it takes."""


def take_next_shard(token: str, gate: str = "") -> str:
    """The CTEs ``next`` and ``claimed`` of a statement that takes the ``%(take)s`` lowest open
    shards of ``%(step_id)s`` nobody holds, under the lease whose token the parameter ``token``
    names, when ``gate`` (a condition starting with ``AND``) holds; ``claimed`` returns what
    each shard's work needs. A lane's claim is this statement alone; a shard's checkpoint, or
    a batch's, takes the next shards with it. The shards taken are an array computed once, so
    the update reaches their rows by the primary key's full index condition whatever plan the
    join would have had: with a join on ``next``, a fan-out shard cost PostgreSQL a quarter
    more CPU (bench.step_cost)."""
    return f"""next AS (
        SELECT shard FROM step_runs
         WHERE job_id = %(job_id)s AND step_id = %(step_id)s AND {OPEN_SHARD_PREDICATE}
           AND (status IN {STEP_DUE_SQL} OR lease_until < %(now)s){gate}
         ORDER BY shard
         LIMIT %(take)s
         FOR UPDATE SKIP LOCKED
    ), claimed AS (
        UPDATE step_runs AS s
           SET {TAKE_LEASE.replace("%(token)s", token)}
          FROM jobs AS j
         WHERE s.job_id = %(job_id)s AND s.step_id = %(step_id)s
           AND s.shard = ANY(ARRAY(SELECT shard FROM next))
           AND j.id = s.job_id
           AND {row_test(f"j.status IN {sql_in((JobStatus.RUNNING, JobStatus.AWAITING_APPROVAL))}")}
        RETURNING s.shard, s.attempts, s.item, s.inputs_from, j.profile_hash
    )"""


def _step_row(key: StepKey, *conditions: ColumnElement[bool]) -> Select[StepRunRow]:
    return select(StepRunRow).where(
        StepRunRow.job_id == key.job_id,
        StepRunRow.step_id == key.step_id,
        StepRunRow.shard == key.shard,
        *conditions,
    )


def lock_step(session: Session, key: StepKey) -> StepRunRow:
    row = session.scalars(_step_row(key).with_for_update()).one_or_none()
    if row is None:
        raise StopChain(f"no step {key}")
    return row


def holds_lease(row: StepRunRow, lease: Lease) -> bool:
    return row.status == StepStatus.RUNNING and row.lease_token == lease.token


def held_step(session: Session, key: StepKey, lease: Lease) -> StepRunRow | None:
    """The step's row, locked, while ``lease`` still holds it; ``None`` once it does not."""
    row = lock_step(session, key)
    return row if holds_lease(row, lease) else None


def live_job(session: Session, job_id: uuid.UUID) -> JobRow:
    """The job a holder works for; ``StopChain`` once it is over, since nothing of it runs then."""
    job = session.get(JobRow, job_id)
    if job is None or job.status in JOB_FINAL:
        raise StopChain(f"job {job_id} is over")
    return job


HeldRows = tuple[JobRow, StepRunRow]


def held_rows(session: Session, key: StepKey, lease: Lease) -> HeldRows | None:
    """The job and the locked row of a step ``lease`` still holds: what parking it, or its
    fan-out, writes on."""
    row = held_step(session, key, lease)
    return None if row is None else (live_job(session, key.job_id), row)


def parked_rows(
    session: Session, key: StepKey, still: ColumnElement[bool], *, skip_locked: bool = False
) -> HeldRows | None:
    """A parked step's job and row, locked in the order a cancel takes them (the job first),
    for whoever resumes it without a lease (a timer, a child's end); ``None`` when the row no
    longer meets ``still`` or its job is over, as a cancel or another resumer left them."""
    job = session.scalars(select(JobRow).where(JobRow.id == key.job_id).with_for_update()).one()
    locked = _step_row(key, still).with_for_update(skip_locked=skip_locked)
    row = session.scalars(locked).one_or_none()
    return None if row is None or job.status in JOB_FINAL else (job, row)


def due_rows(
    session: Session,
    due: ColumnElement[bool],
    still: ColumnElement[bool],
    now: datetime,
    limit: int,
) -> Iterator[HeldRows]:
    """Up to ``limit`` steps that ``due`` finds parked with their ``wake_at`` come, oldest
    first, each locked as ``parked_rows`` locks it when the caller reaches it; one a cancel or
    another resumer settled meanwhile is passed over."""
    found = session.execute(
        select(StepRunRow.job_id, StepRunRow.step_id)
        .where(due, StepRunRow.wake_at <= now)
        .order_by(StepRunRow.wake_at)
        .limit(limit)
    ).all()
    for job_id, step_id in found:
        rows = parked_rows(session, StepKey(job_id, step_id), still, skip_locked=True)
        if rows is not None:
            yield rows


def renew_lease(
    session: Session, key: StepKey, lease: Lease, lease_s: float, now: datetime
) -> bool:
    """Extend a held lease, with its batch's; ``False`` when the step was taken away or its
    job ended."""
    where = (
        StepRunRow.job_id == key.job_id,
        StepRunRow.step_id == key.step_id,
        StepRunRow.shard.in_(_shards(key, lease)),
        StepRunRow.status == StepStatus.RUNNING,
    )
    renewed = _renewed(session, StepRunRow, where, lease.token, lease_s, now, StepRunRow.shard)
    return key.shard in renewed


def _shards(key: StepKey, lease: Lease) -> list[int]:
    return sorted({key.shard, *lease.batch})


_RELEASE = f"""
    UPDATE step_runs SET lease_token = NULL, lease_until = %(now)s
     WHERE job_id = %(job_id)s AND step_id = %(step_id)s AND shard = ANY(%(shards)s::int[])
       AND status = '{StepStatus.RUNNING}' AND lease_token = %(token)s
    """


def release_lease(conn: psycopg.Connection[Any], key: StepKey, lease: Lease, now: datetime) -> None:
    """End an attempt that could not record its outcome as if its worker had died, but now
    rather than ``lease_s`` later: the step stays ``running`` under a lapsed lease, which the next
    delivery claims at once and, should none come, the sweeper re-sends. Only the holder of the
    lease's token can release it, and a renewal in flight cannot revive it. A lane's batch is
    released whole."""
    conn.execute(
        _RELEASE,
        {
            "now": now,
            "job_id": key.job_id,
            "step_id": key.step_id,
            "shards": _shards(key, lease),
            "token": lease.token,
        },
    )


_GIVE_BACK = _RELEASE.replace("%(now)s", "%(now)s, attempts = attempts - 1")


def give_back_shards(
    conn: psycopg.Connection[Any], shards: Sequence[ShardClaim], now: datetime
) -> None:
    """Shards a lane took together but did not run, as if they had not been taken: their lease
    lapsed now and their attempt not counted, so the next claim, this lane's or another's,
    takes them at once and runs the attempt they were due."""
    first = shards[0]
    conn.execute(
        _GIVE_BACK,
        {
            "now": now,
            "job_id": first.key.job_id,
            "step_id": first.key.step_id,
            "shards": [shard.key.shard for shard in shards],
            "token": first.lease.token,
        },
    )


def take_compensation(row: CompensationRow, lease_s: float, now: datetime) -> None:
    """Take the lease of a compensation whose row the caller locked and found free."""
    row.status = CompensationStatus.RUNNING
    row.attempts += 1
    row.lease_token = uuid.uuid4().hex
    row.lease_until = now + timedelta(seconds=lease_s)
    row.started_at = now


def renew_compensation(
    session: Session, job_id: uuid.UUID, step_id: str, token: str, lease_s: float, now: datetime
) -> bool:
    """Extend a running compensation's lease; ``False`` once it is no longer this token's."""
    where = (
        CompensationRow.job_id == job_id,
        CompensationRow.step_id == step_id,
        CompensationRow.status == CompensationStatus.RUNNING,
    )
    return bool(
        _renewed(session, CompensationRow, where, token, lease_s, now, CompensationRow.step_id)
    )


def release_compensation(
    session: Session, job_id: uuid.UUID, step_id: str, token: str, now: datetime
) -> None:
    """An attempt cut short before its outcome: the next delivery may take it at once."""
    session.execute(
        update(CompensationRow)
        .where(
            CompensationRow.job_id == job_id,
            CompensationRow.step_id == step_id,
            CompensationRow.lease_token == token,
        )
        .values(lease_token=None, lease_until=now, status=CompensationStatus.PENDING)
    )


def _renewed(
    session: Session,
    held: type[StepRunRow] | type[CompensationRow],
    where: tuple[ColumnElement[bool], ...],
    token: str,
    lease_s: float,
    now: datetime,
    returning: InstrumentedAttribute[Any],
) -> list[Any]:
    """What ``returning`` reads of each row whose lease was extended."""
    renewed = session.scalars(
        update(held)
        .where(*where, held.lease_token == token)
        .values(lease_until=now + timedelta(seconds=lease_s))
        .returning(returning)
    )
    return list(renewed)
