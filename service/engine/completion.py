"""Settling a step: its checkpoint written once (and, on the fast path, its next step taken in
the same statement), its lease released or renewed, a failure recorded for a retry or for
good."""

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from service.engine.compensations import record_compensations
from service.engine.settle import close_open_steps, settle_job
from service.engine.steps import (
    _INPUT_OUTPUTS,
    _TAKE_LEASE,
    Completion,
    Follow,
    Lease,
    StepKey,
    Taken,
    _lock_step,
    holds_lease,
    release_children,
)
from service.language.plan import JobPlan, steps_plan
from service.language.profiles import Profile
from service.language.snapshots import job_profile, step_facts
from service.platform import metrics
from service.platform.constants import SHARD_NONE
from service.platform.models import JobRow, StepRunRow
from service.platform.states import (
    JOB_FINAL,
    JOB_OPEN_SQL,
    STEP_DUE_SQL,
    JobStatus,
    StepStatus,
    sql_in,
)

_SUCCEEDED_OR_SKIPPED = sql_in((StepStatus.SUCCEEDED, StepStatus.REUSED, StepStatus.SKIPPED))
_COMPLETED = f"""
    WITH done AS (
        UPDATE step_runs
           SET status = '{StepStatus.SUCCEEDED}', finished_at = %(now)s, lease_token = NULL,
               lease_until = NULL
         WHERE job_id = %(job_id)s AND step_id = %(step_id)s AND shard = %(shard)s
           AND status = '{StepStatus.RUNNING}' AND lease_token = %(token)s
        RETURNING job_id
    ), saved AS (
        INSERT INTO step_checkpoints (job_id, step_id, shard, attempt, output, created_at)
        SELECT job_id, %(step_id)s, %(shard)s, %(attempt)s, %(output)s, %(now)s FROM done
        ON CONFLICT DO NOTHING
        RETURNING job_id
    )"""
_COMPLETE = (
    _COMPLETED
    + """, released AS (
        UPDATE step_runs SET waiting_on = waiting_on - 1
         WHERE job_id = %(job_id)s AND step_id = ANY(%(children)s) AND shard = -1
           AND EXISTS (SELECT 1 FROM done)
        RETURNING step_id, waiting_on
    )
    SELECT EXISTS (SELECT 1 FROM saved),
           ARRAY(SELECT step_id FROM released WHERE waiting_on = 0), NULL::text"""
)
"""The checkpoint, and the step counted off its children in the same statement, so a
redelivered message that finds the step settled cannot count it twice."""
_COMPLETE_AND_TAKE = (
    _COMPLETED
    + f""", claimed AS (
        UPDATE step_runs AS s
           SET waiting_on = 0, {_TAKE_LEASE.replace("%(token)s", "%(taken_token)s")}
          FROM jobs AS j
         WHERE s.job_id = %(job_id)s AND s.step_id = %(take)s AND s.shard = -1
           AND s.waiting_on = 1 AND s.status IN {STEP_DUE_SQL}
           AND j.id = s.job_id AND j.status IN {JOB_OPEN_SQL}
           AND EXISTS (SELECT 1 FROM done)
        RETURNING s.attempts, s.inputs_from
    ), released AS (
        UPDATE step_runs SET waiting_on = waiting_on - 1
         WHERE job_id = %(job_id)s AND step_id = ANY(%(children)s) AND shard = -1
           AND EXISTS (SELECT 1 FROM done)
           AND NOT (step_id = %(take)s AND EXISTS (SELECT 1 FROM claimed))
        RETURNING step_id, waiting_on
    )
    SELECT EXISTS (SELECT 1 FROM saved),
           ARRAY(SELECT step_id FROM released WHERE waiting_on = 0), NULL::text,
           c.attempts,
           {_INPUT_OUTPUTS}
           || CASE WHEN %(step_id)s = ANY(c.inputs_from)
                   THEN jsonb_build_object(%(step_id)s, %(output)s::jsonb)
                   ELSE '{{}}'::jsonb END
      FROM (SELECT 1) AS one LEFT JOIN claimed AS c ON true"""
)
"""The checkpoint and the claim of the child that ``Follow`` names, when this step was its
only upstream, in one statement: what ``_FAST_CLAIM`` would have done a message later, under
the same conditions. Every other child is counted off as in ``_COMPLETE``. The child reads
this step's output from the statement's parameter, since its own checkpoint row is not
visible to the statement that writes it."""
_COMPLETE_AND_SUCCEED_JOB = (
    _COMPLETED
    + f""", succeeded AS (
        UPDATE jobs SET status = '{JobStatus.SUCCEEDED}', finished_at = %(now)s, result = %(result)s
         WHERE id = %(job_id)s AND status IN {sql_in((JobStatus.QUEUED, JobStatus.RUNNING))}
           AND EXISTS (SELECT 1 FROM saved)
           AND NOT EXISTS (
               SELECT 1 FROM step_runs
                WHERE job_id = %(job_id)s AND shard = -1 AND step_id <> %(step_id)s
                  AND status NOT IN {_SUCCEEDED_OR_SKIPPED})
        RETURNING trigger
    )
    SELECT EXISTS (SELECT 1 FROM saved), ARRAY[]::text[], (SELECT trigger FROM succeeded)"""
)


def complete_step(
    conn: psycopg.Connection[Any],
    key: StepKey,
    lease: Lease,
    output: Any,
    now: datetime,
    *,
    profile: Profile,
    succeeds_job: bool = False,
    follow: Follow | None = None,
) -> Completion:
    """Checkpoint a finished attempt in one statement, unless its lease was lost meanwhile.

    With ``succeeds_job`` (the job's sole sink, whose output is the job's result, see
    ``settle.sink_settles_job``) the same statement succeeds the job; a sink has no children.
    With ``follow`` it also claims that child for the caller.
    """
    params = {
        "now": now,
        "job_id": key.job_id,
        "step_id": key.step_id,
        "shard": key.shard,
        "token": lease.token,
        "attempt": lease.attempt,
        "output": Jsonb(output),
    }
    if succeeds_job:
        params["result"] = Jsonb({key.step_id: output})
    else:
        children = step_facts(profile, key.step_id).children if key.shard == SHARD_NONE else ()
        params["children"] = list(children)
    if follow is not None and not succeeds_job:
        return _complete_and_take(conn, key, params, profile, follow)
    statement = _COMPLETE_AND_SUCCEED_JOB if succeeds_job else _COMPLETE
    row = conn.execute(statement, params).fetchone()
    assert row is not None
    written, ready, succeeded_trigger = row
    return Completion(written, steps_plan(profile, key.job_id, ready), succeeded_trigger)


def _complete_and_take(
    conn: psycopg.Connection[Any],
    key: StepKey,
    params: dict[str, Any],
    profile: Profile,
    follow: Follow,
) -> Completion:
    child = StepKey(key.job_id, follow.step_id)
    token = uuid.uuid4().hex
    params |= {
        "take": follow.step_id,
        "taken_token": token,
        "until": params["now"] + timedelta(seconds=follow.lease_s),
        "task_id": follow.task_id,
    }
    row = conn.execute(_COMPLETE_AND_TAKE, params).fetchone()
    assert row is not None
    written, ready, _, attempts, outputs = row
    taken = None if attempts is None else Taken(child, Lease(token, attempts), outputs)
    return Completion(written, steps_plan(profile, key.job_id, ready), None, taken)


_RELEASE = f"""
    UPDATE step_runs SET lease_token = NULL, lease_until = %(now)s
     WHERE job_id = %(job_id)s AND step_id = %(step_id)s AND shard = %(shard)s
       AND status = '{StepStatus.RUNNING}' AND lease_token = %(token)s
    """


def release_lease(conn: psycopg.Connection[Any], key: StepKey, lease: Lease, now: datetime) -> None:
    """End an attempt that could not record its outcome as if its worker had died, but now
    rather than ``lease_s`` later: the step stays ``running`` under a lapsed lease, which the next
    delivery claims at once and, should none come, the sweeper re-sends. Only the holder of the
    lease's token can release it, and a renewal in flight cannot revive it."""
    conn.execute(
        _RELEASE,
        {
            "now": now,
            "job_id": key.job_id,
            "step_id": key.step_id,
            "shard": key.shard,
            "token": lease.token,
        },
    )


@dataclass(frozen=True)
class Failed:
    """A failure: whether it ended the job, the children it made ready, and whether it was
    recorded at all (a worker that lost its lease records nothing)."""

    job_over: bool
    ready: JobPlan
    recorded: bool = True


def fail_step(
    session: Session,
    key: StepKey,
    lease: Lease,
    error: dict[str, Any],
    *,
    retry_delay_s: float | None,
    now: datetime,
) -> Failed:
    """Record a failed attempt: back to ``retrying``, or failed for good under the job's policy.

    A worker that lost its lease records nothing.
    """
    row = _lock_step(session, key)
    if not holds_lease(row, lease):
        return Failed(False, JobPlan(key.job_id), recorded=False)
    return _record_failure(session, row, key, error, retry_delay_s, now)


def mark_succeeded(row: StepRunRow, now: datetime) -> None:
    """The ORM's form of ``_COMPLETED``'s update, for a step whose checkpoint its transaction
    wrote and whose row it holds."""
    row.status = StepStatus.SUCCEEDED
    row.finished_at = now
    row.lease_token = None
    row.lease_until = None


def _record_failure(
    session: Session,
    row: StepRunRow,
    key: StepKey,
    error: dict[str, Any],
    retry_delay_s: float | None,
    now: datetime,
    status: StepStatus = StepStatus.FAILED,
) -> Failed:
    """Under ``best_effort`` a step failed for good counts as settled to its children, whose
    ``needs`` rule then decides whether they run or are skipped. A rejected step is failed for
    good under its own ``status``."""
    row.error = error
    row.lease_token = None
    row.lease_until = None
    nothing = JobPlan(key.job_id)
    if retry_delay_s is not None:
        row.status = StepStatus.RETRYING
        return Failed(False, nothing)
    row.status = status
    row.finished_at = now
    job = session.scalars(select(JobRow).where(JobRow.id == key.job_id).with_for_update()).one()
    if job.status in JOB_FINAL:
        return Failed(True, nothing)
    profile = job_profile(job)
    if profile.failure_policy == "fail_fast":
        _fail_job(session, job, key, error, now)
        undo = record_compensations(session, job, profile, now)
        return Failed(True, JobPlan(key.job_id, compensate=undo))
    ready = release_children(session, key, profile)
    if key.shard == SHARD_NONE:
        settle_job(session, key.job_id, now)
    return Failed(job.status in JOB_FINAL, ready)


def _fail_job(
    session: Session, job: JobRow, key: StepKey, error: dict[str, Any], now: datetime
) -> None:
    where = f"step {key.step_id!r}" + (f" item {key.shard}" if key.shard != SHARD_NONE else "")
    job.status = JobStatus.FAILED
    job.finished_at = now
    metrics.job_finished(session, job.pipeline, job.trigger, job.status)
    job.error = {
        "code": error.get("code", "step_failed"),
        "message": f"{where} failed: {error.get('message', '')}",
        "details": {"step_id": key.step_id, "shard": None if key.shard < 0 else key.shard},
    }
    close_open_steps(session, job.id, StepStatus.CANCELLED, now)


def renew_lease(
    session: Session, row_key: StepKey, lease: Lease, lease_s: float, now: datetime
) -> bool:
    """Extend a held lease; ``False`` when the step was taken away or its job ended."""
    renewed = session.execute(
        update(StepRunRow)
        .where(
            StepRunRow.job_id == row_key.job_id,
            StepRunRow.step_id == row_key.step_id,
            StepRunRow.shard == row_key.shard,
            StepRunRow.lease_token == lease.token,
            StepRunRow.status == StepStatus.RUNNING,
        )
        .values(lease_until=now + timedelta(seconds=lease_s))
        .returning(StepRunRow.id)
    ).first()
    return renewed is not None
