"""Claiming a step or a shard: one statement takes every lease (``fast_claim``,
``fast_shard_claim``), its WHERE clause carrying the rules, so two deliveries of the same message
cannot both run a step. When it takes nothing, ``claim_step`` reads why under row locks and
either stops, skips the step, or takes it through the same statement past an upstream step its
``needs`` rule lets it run without; a lane only checks that its job is still open. What a held
step then becomes is decided once by ``parking`` (it waits, or its ``when`` settles it) and
otherwise made by ``inputs`` (``use_fast_claim``).
"""

import uuid
from datetime import datetime, timedelta
from typing import Any, LiteralString

import psycopg
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.engine.checkpoints import INPUT_OUTPUTS
from service.engine.completion import skip_step
from service.engine.inline_events import RETURNS_JOB, job_event, logged, mark, step_event
from service.engine.inputs import Held, resolve_held
from service.engine.leases import TAKE_LEASE, live_job, lock_step, take_next_shard
from service.engine.parking import Goes, NotHeld, Parked, park
from service.engine.profiles import stored_profile
from service.engine.steps import (
    Claimed,
    FanOutDue,
    FastClaim,
    Lease,
    ShardClaim,
    Skipped,
    StepKey,
    Unresolvable,
    Woke,
)
from service.language.profiles import Profile
from service.language.snapshots import job_profile, known_profile, parsed_profile
from service.language.specs import StepSpec
from service.platform.constants import SHARD_NONE, WAIT_FOR_PEER_MAX_S
from service.platform.db import driver
from service.platform.errors import RetryLater, StopChain
from service.platform.models import StepRunRow
from service.platform.states import (
    JOB_OPEN_SQL,
    STEP_DUE_SQL,
    STEP_FINAL,
    STEP_PARKED,
    STEP_SUCCESSFUL,
    STEP_SUCCESSFUL_SQL,
    JobStatus,
    StepStatus,
    row_test,
    sql_in,
)

_UPSTREAM_SUCCEEDED = f"""
           AND NOT EXISTS (
               SELECT 1 FROM step_runs AS u
                WHERE u.job_id = s.job_id AND u.shard = -1
                  AND u.step_id = ANY(s.depends_on)
                  AND u.status NOT IN {STEP_SUCCESSFUL_SQL})"""


_JOB_RUNS_STEPS = row_test(f"j.status IN {JOB_OPEN_SQL} AND j.waiting_for IS NULL")
"""The claimed step's job ``j`` is open and waits for nothing (a slot, its turn) before it runs."""


def _claim_statement(upstream: str, *, inline: bool) -> str:
    """The one statement that takes a step's lease. ``upstream`` is the condition on the
    step's upstream: every one succeeded, or nothing when the caller has read under lock
    that the step's ``needs`` rule runs it past one that did not. With ``inline`` (an
    autocommitted statement) it appends the events of its changes itself."""
    step_mark, job_mark = (f", {mark('s')}", f", {mark('jobs')}") if inline else ("", "")
    events = (
        f""", {
            logged(
                step_event(1, StepStatus.RUNNING, "claimed"),
                job_event(2, JobStatus.RUNNING, "started"),
            )
        }"""
        if inline
        else ""
    )
    return f"""
    WITH claimed AS (
        UPDATE step_runs AS s
           SET {TAKE_LEASE}{step_mark}
          FROM jobs AS j
         WHERE s.job_id = %(job_id)s AND s.step_id = %(step_id)s AND s.shard = -1
           AND j.id = s.job_id AND {_JOB_RUNS_STEPS}
           AND (s.status IN {STEP_DUE_SQL}
                OR (s.status = '{StepStatus.RUNNING}' AND s.lease_until < %(now)s)){upstream}
        RETURNING s.step_id, s.attempts, s.round, s.inputs_from, j.profile_hash, j.params
    ), started AS (
        UPDATE jobs SET status = '{JobStatus.RUNNING}', started_at = %(now)s{job_mark}
         WHERE id = %(job_id)s AND {row_test(f"status = '{JobStatus.QUEUED}'")}
           AND EXISTS (SELECT 1 FROM claimed)
        RETURNING {RETURNS_JOB}
    ){events}
    SELECT c.attempts, c.profile_hash, c.params,
           {INPUT_OUTPUTS} AS outputs
      FROM claimed AS c
    """


_FAST_CLAIM = _claim_statement(_UPSTREAM_SUCCEEDED, inline=True)
_CLAIM_PAST_UPSTREAM = _claim_statement("", inline=False)


def _lease_params(key: StepKey, task_id: str, lease_s: float, now: datetime) -> dict[str, Any]:
    """The parameters of a claim statement: a fresh lease token, its expiry, and whose it is."""
    return {
        "token": uuid.uuid4().hex,
        "until": now + timedelta(seconds=lease_s),
        "task_id": task_id,
        "now": now,
        "job_id": key.job_id,
        "step_id": key.step_id,
    }


def fast_claim(
    conn: psycopg.Connection[Any],
    key: StepKey,
    *,
    task_id: str,
    lease_s: float,
    now: datetime,
    past_upstream: bool = False,
) -> FastClaim | None:
    """Take a ready step nobody holds, in one statement: autocommitted on its own, or inside
    ``claim_step``'s transaction with ``past_upstream``.

    ``None`` sends the caller to ``claim_step`` to find out why not: the step is settled, held
    by a live lease, waiting on its upstream or on a decision, or its job is over.
    """
    params = _lease_params(key, task_id, lease_s, now)
    token = params["token"]
    row = conn.execute(_CLAIM_PAST_UPSTREAM if past_upstream else _FAST_CLAIM, params).fetchone()
    if row is None:
        return None
    attempts, profile_hash, job_params, outputs = row
    profile = _snapshot(conn, key.job_id, profile_hash)
    return FastClaim(Lease(token, attempts), profile, job_params, outputs)


def claim_step(
    session: Session, key: StepKey, *, task_id: str, lease_s: float, now: datetime
) -> Claimed | FanOutDue | Unresolvable | Skipped | Woke | None:
    """Claim a step, reading under row locks why the statement alone would not. ``None`` when
    there is nothing to run: the step is settled, waits for a decision, a signal or its wake
    time, or waits for its upstream (this message came early; the last upstream step to settle
    sends it again). Raises ``RetryLater`` while a live lease holds it, ``StopChain`` once its
    job is over."""
    job = live_job(session, key.job_id)
    row = lock_step(session, key)
    if row.status in STEP_FINAL or row.status in STEP_PARKED or _fanned_out(row):
        return None
    _wait_for_peer(row, now)
    profile = job_profile(job)
    runs = _upstream_allows(session, row, profile.step(row.step_id))
    if runs is None:
        return None
    if not runs:
        return skip_step(session, row, profile, now)
    fast = fast_claim(
        driver(session), key, task_id=task_id, lease_s=lease_s, now=now, past_upstream=True
    )
    session.expire_all()
    return None if fast is None else use_fast_claim(session, key, fast, now)


def use_fast_claim(
    session: Session, key: StepKey, claim: FastClaim, now: datetime
) -> Claimed | FanOutDue | Unresolvable | Skipped | Woke | None:
    """Turn a fast claim into work in a transaction, acting on what ``parking`` decided: a step
    that parked, or whose lease is no longer this worker's, runs nothing now (``None``); one its
    ``when`` or its wait settled hands on what that made ready; one that goes on is held to fan
    out, for a for_each step, or has its inputs resolved."""
    held = Held.of(key, claim)
    decision = park(session, held, now)
    if isinstance(decision, Parked | NotHeld):
        return None
    if not isinstance(decision, Goes):
        return decision
    if decision.rows is not None and held.spec.for_each is not None:
        return FanOutDue(*decision.rows, held.spec)
    return resolve_held(session, held, now)


def _fanned_out(row: StepRunRow) -> bool:
    """A for_each step whose shards are recorded: its lanes and its gather run it, and the
    sweeper sends them again if their messages were lost. Its own message, delivered again
    after a worker died between the fan-out's commit and the lanes' publish, is acknowledged:
    waiting for a lease nobody holds kept it held by a worker, retrying every second, where the
    sweeper does not look (a chaos drill's fan-out that never ended)."""
    return row.status == StepStatus.RUNNING and row.lease_until is None


def _wait_for_peer(row: StepRunRow, now: datetime) -> None:
    """Someone else holds this step: come back once their lease could have lapsed."""
    if row.status == StepStatus.RUNNING and row.lease_until is not None and row.lease_until > now:
        remaining = (row.lease_until - now).total_seconds()
        raise RetryLater(min(max(remaining, 0.2), WAIT_FOR_PEER_MAX_S), "held by a live lease")


def _upstream_allows(session: Session, row: StepRunRow, spec: StepSpec) -> bool | None:
    """Whether the step's ``needs`` rule lets it run on what its upstream did.

    ``None`` while some upstream step is unsettled: this message came early (a re-publish),
    and the last upstream step to settle sends the step again.
    """
    upstream = _upstream_statuses(session, row.job_id, spec.depends_on)
    if any(status not in STEP_FINAL for status in upstream):
        return None
    succeeded = [status in STEP_SUCCESSFUL for status in upstream]
    return all(succeeded) if spec.needs == "all" else any(succeeded) or not upstream


def _upstream_statuses(session: Session, job_id: uuid.UUID, deps: list[str]) -> list[str]:
    if not deps:
        return []
    return list(
        session.scalars(
            select(StepRunRow.status).where(
                StepRunRow.job_id == job_id,
                StepRunRow.shard == SHARD_NONE,
                StepRunRow.step_id.in_(deps),
            )
        )
    )


_TAKEN_BY = f"""
    SELECT step_id FROM step_runs
     WHERE job_id = %(job_id)s AND shard = -1 AND task_id = %(task_id)s
       AND status IN {sql_in((StepStatus.RUNNING, StepStatus.RETRYING))}
     ORDER BY started_at DESC LIMIT 1
    """


def taken_by(conn: psycopg.Connection[Any], job_id: uuid.UUID, task_id: str) -> str | None:
    """The step of the job that the message ``task_id`` went on to and left unsettled: its
    checkpoint claimed the step (``Follow``), then its worker died or the step is to be tried
    again. A message that is delivered again, or retried, continues there."""
    row = conn.execute(_TAKEN_BY, {"job_id": job_id, "task_id": task_id}).fetchone()
    return None if row is None else str(row[0])


_FAST_SHARD_CLAIM = f"""
    WITH {take_next_shard("%(token)s")}
    SELECT c.shard, c.attempts, c.item, c.profile_hash,
           {INPUT_OUTPUTS} AS outputs
      FROM claimed AS c
     ORDER BY c.shard
    """


def fast_shard_claims(
    conn: psycopg.Connection[Any],
    parent: StepKey,
    *,
    take: int,
    task_id: str,
    lease_s: float,
    now: datetime,
) -> list[ShardClaim]:
    """Up to ``take`` open shards of a fan-out in one autocommitted statement, in shard order,
    under one lease token.

    Empty when no shard is open to this lane, or the job is over (``no_shard_left``).
    """
    params = _lease_params(parent, task_id, lease_s, now) | {"take": take}
    token = params["token"]
    rows = conn.execute(_FAST_SHARD_CLAIM, params).fetchall()
    if not rows:
        return []
    profile = _snapshot(conn, parent.job_id, rows[0][3])
    taken = [(shard, attempts, item, outputs) for shard, attempts, item, _, outputs in rows]
    return ShardClaim.batch(parent, token, profile, taken)


def no_shard_left(session: Session, parent: StepKey) -> None:
    """Why ``fast_shard_claim`` took nothing: every open shard is held by another lane or
    settled, or the job is over, which raises ``StopChain``."""
    live_job(session, parent.job_id)


def job_params(conn: psycopg.Connection[Any], job_id: uuid.UUID) -> dict[str, Any]:
    """Read once per lane message: a job's params never change, and may be large."""
    return _job_json(conn, "SELECT params FROM jobs WHERE id = %s", job_id)


def _snapshot(conn: psycopg.Connection[Any], job_id: uuid.UUID, profile_hash: str) -> Profile:
    """The job's profile, read from ``job_profiles`` only the first time this process meets its
    hash."""
    known = known_profile(profile_hash)
    if known is not None:
        return known
    data = stored_profile(conn, profile_hash)
    if data is None:
        raise StopChain(f"the profile of job {job_id} is gone")
    return parsed_profile(profile_hash, data)


def _job_json(
    conn: psycopg.Connection[Any], query: LiteralString, job_id: uuid.UUID
) -> dict[str, Any]:
    row = conn.execute(query, (job_id,)).fetchone()
    if row is None:
        raise StopChain(f"job {job_id} is gone")
    value: dict[str, Any] = row[0]
    return value
