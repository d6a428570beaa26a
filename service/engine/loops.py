"""Loops: a group of steps run round after round until a condition holds (evaluate, refine).

A loop's steps keep one row each; the row's ``round`` says which round it is in. When the
loop's last step succeeds, the transaction that checkpoints it also decides: ``until`` holds,
or the rounds are used up, and the loop is over (its last step's dependents are released as for
any step); otherwise every step of the loop is archived into ``step_rounds`` with its output,
set back to ``pending`` in the next round, and the loop's first steps are sent. A worker killed
mid-round leaves a lapsed lease in that round, which the next delivery takes over: the round
goes on, the loop does not start again.
"""

import uuid
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb
from sqlalchemy.orm import Session

from service.catalogue.notices import record_event
from service.engine.checkpoints import step_outputs, write_checkpoint
from service.engine.completion import mark_succeeded, record_failure, succeed_step
from service.engine.gates import ask_decision
from service.engine.inputs import loop_context
from service.engine.leases import held_step
from service.engine.steps import Lease, StepKey
from service.language.conditions import evaluate
from service.language.expressions import ExprContext
from service.language.plan import JobPlan, steps_plan
from service.language.profiles import LoopSpec, Profile
from service.language.snapshots import step_facts
from service.platform.db import driver
from service.platform.errors import ExpressionError
from service.platform.models import JobRow, StepRunRow
from service.platform.states import StepStatus


def close_round(session: Session, row: StepRunRow, profile: Profile, now: datetime) -> JobPlan:
    """The loop's last step has just written its checkpoint in this transaction and is still
    running: end the loop or go round. Its status is decided here, once: succeeded (the loop
    ends as it should, or goes round), waiting for a person, or failed."""
    key = StepKey(row.job_id, row.step_id)
    loop = profile.loop_of(row.step_id)
    assert loop is not None
    job = session.get(JobRow, row.job_id)
    assert job is not None
    try:
        done = evaluate(loop.condition, _until_context(session, key, job, profile, loop))
    except ExpressionError as exc:
        error = {"code": exc.code, "message": exc.message, "details": exc.details}
        return record_failure(session, row, key, error, None, now).ready
    if done or row.round >= loop.max_rounds:
        return _end(session, row, job, profile, loop, done, now)
    mark_succeeded(row, now)
    session.flush()
    next_round(session, job.id, profile, loop)
    session.expire(row)
    record_event(session, job.id, "loop_round", {"step_id": row.step_id, "round": row.round})
    entry = [s for s in loop.steps if not set(profile.step(s).depends_on) & set(loop.steps)]
    return steps_plan(profile, job.id, entry)


def _until_context(
    session: Session, key: StepKey, job: JobRow, profile: Profile, loop: LoopSpec
) -> ExprContext:
    readable = {ref.name for ref in loop.condition.refs() if ref.root == "steps" and ref.name}
    return ExprContext(
        params=job.params,
        outputs=step_outputs(session, job.id, readable),
        loop=loop_context(session, key.job_id, key.step_id, profile),
        trigger=job.trigger_data or {},
    )


def _end(
    session: Session,
    row: StepRunRow,
    job: JobRow,
    profile: Profile,
    loop: LoopSpec,
    done: bool,
    now: datetime,
) -> JobPlan:
    key = StepKey(row.job_id, row.step_id)
    if not done and loop.on_exhausted == "escalate":
        ask_decision(session, job, row, loop.decision_timeout_s, now)
        return JobPlan(job.id)
    if not done and loop.on_exhausted == "fail":
        error = {
            "code": "loop_exhausted",
            "message": f"{loop.until} did not hold within {loop.max_rounds} rounds",
            "details": {"rounds": row.round, "until": loop.until},
        }
        return record_failure(session, row, key, error, None, now).ready
    record_event(
        session, job.id, "loop_ended", {"step_id": row.step_id, "rounds": row.round, "done": done}
    )
    return succeed_step(session, row, profile, now)


_ARCHIVE = """
    INSERT INTO step_rounds
           (job_id, step_id, round, status, attempts, started_at, finished_at, error, output)
    SELECT s.job_id, s.step_id, s.round, s.status, s.attempts, s.started_at, s.finished_at,
           s.error, s.output
      FROM step_runs AS s
     WHERE s.job_id = %(job_id)s AND s.shard = -1 AND s.step_id = ANY(%(steps)s)
    ON CONFLICT DO NOTHING
    """
_FORGET_SHARDS = """
    DELETE FROM step_runs WHERE job_id = %(job_id)s AND step_id = ANY(%(steps)s) AND shard >= 0
    """
_NEXT_ROUND = f"""
    UPDATE step_runs AS s
       SET status = '{StepStatus.PENDING}', attempts = 0, round = s.round + 1, started_at = NULL,
           finished_at = NULL, error = NULL, lease_token = NULL, lease_until = NULL,
           task_id = NULL, output = NULL, waiting_on = c.waiting_on
      FROM jsonb_to_recordset(%(counts)s) AS c(step_id text, waiting_on int)
     WHERE s.job_id = %(job_id)s AND s.shard = -1 AND s.step_id = c.step_id
    """


def next_round(session: Session, job_id: uuid.UUID, profile: Profile, loop: LoopSpec) -> None:
    """Keep the round that ended, then start the loop's steps over, each waiting on its
    upstream inside the loop (what lies before the loop stays settled)."""
    inside = set(loop.steps)
    counts = [
        {"step_id": s, "waiting_on": len(set(profile.step(s).depends_on) & inside)}
        for s in loop.steps
    ]
    values = {"job_id": job_id, "steps": loop.steps, "counts": Jsonb(counts)}
    conn = driver(session)
    for statement in (_ARCHIVE, _FORGET_SHARDS, _NEXT_ROUND):
        conn.execute(statement, values)


def settle_succeeded(session: Session, row: StepRunRow, profile: Profile, now: datetime) -> JobPlan:
    """What follows a running step whose checkpoint this transaction wrote: the last step of a
    loop closes its round; any other succeeds and releases its children."""
    if step_facts(profile, row.step_id).ends_round:
        return close_round(session, row, profile, now)
    return succeed_step(session, row, profile, now)


def complete_round(
    session: Session, key: StepKey, lease: Lease, output: Any, profile: Profile, now: datetime
) -> JobPlan:
    """Checkpoint the last step of a loop and close its round in one transaction, so the
    decision to go round again is never lost between the two."""
    row = held_step(session, key, lease)
    if row is None:
        return JobPlan(key.job_id)
    write_checkpoint(session, key, output)
    return close_round(session, row, profile, now)
