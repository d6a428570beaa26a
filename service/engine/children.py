"""Sub-pipelines: a ``pipeline.run`` step starts a child job and, with ``wait: true``, parks
until the child ends, its output then the child's result.

The claim's transaction (``service.engine.parking``) records the call, keyed by (job, step,
attempt), and parks the step ``awaiting_child`` with no lease: the worker moves on at once,
so the child may run on the very slot its parent had. The elected beat replica does the rest
on its tick (``advance_children``), each part in its caller's transaction, what it sends going
out after the commit:

- it starts each recorded call's child through ``submission.submit_job``, under the parent's
  owner, with an idempotency key made of (job, step, attempt): an attempt has one child
  however often its message or this tick runs. A step that does not wait succeeds there,
  reading ``{job_id}``;
- it settles a waiting step whose child ended: a success checkpoints the child's result, a
  failure fails the step under its retry policy (a retry is a new attempt, so a new child);
  a retry waits out the policy's backoff as ``retrying``, its ``wake_at`` set and no message
  out, and a later tick sends it once due, as a ``wait`` step is woken;
- it cancels the open children of a job that ended other than in success, their
  compensations sent as for any cancel.

PostgreSQL wakes the leader when a child ends or a parked parent is cancelled (migration
0032), so a parent goes on at once; the leader's every tick looks again whatever it was woken
for, so a lost wake-up delays a parent by at most a tick, and a worker, a beat replica or
Redis lost meanwhile loses nothing: only PostgreSQL knows who waits for whom.
"""

import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import and_, exists, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from service.catalogue.notices import record_event
from service.engine.checkpoints import write_checkpoint
from service.engine.compensations import unfinished
from service.engine.completion import record_failure, succeed_step, unresolvable
from service.engine.jobs import cancel_job
from service.engine.leases import HeldRows, due_rows, parked_rows
from service.engine.steps import StepKey, Unresolvable
from service.engine.submission import JobRequest, Outcome, submit_job
from service.engine.waits import TIMED_RETRY
from service.language.plan import JobPlan, steps_plan
from service.language.snapshots import job_profile
from service.language.subpipes import child_call
from service.platform.constants import (
    CHILD_BATCH,
    SCHEDULES_CHANNEL,
    SHARD_NONE,
    TRIGGER_PARENT,
    TRIGGER_RERUN,
)
from service.platform.db import driver
from service.platform.errors import (
    ChildInvalid,
    FlowbeatError,
    JobConflict,
    PipelineDepthExceeded,
)
from service.platform.models import ChildCallRow, JobRow, StepRunRow
from service.platform.states import JOB_FINAL, JOB_OPEN, JobStatus, StepStatus

_BACKING_OFF = and_(
    TIMED_RETRY,
    exists().where(JobRow.id == StepRunRow.job_id, JobRow.status.in_(list(JOB_OPEN))),
)
"""Of an open job: one a job ended some other way than through ``close_open_steps`` left
behind would otherwise keep the leader ticking at once."""


@dataclass
class ChildWork:
    """What a tick leaves to send once committed: children started, parents' steps made ready,
    tasks of cancelled children to revoke, cancelled children with compensations to run."""

    started: list[JobRow] = field(default_factory=list)
    ready: list[JobPlan] = field(default_factory=list)
    revoke: list[str] = field(default_factory=list)
    compensate: list[uuid.UUID] = field(default_factory=list)


@dataclass(frozen=True)
class Starter:
    """What starting a child needs from the leader's process."""

    profiles_dir: Path | None
    known_actions: Collection[str]
    max_depth: int


def call_child(
    session: Session, rows: HeldRows, attempt: int, inputs: Mapping[str, Any], now: datetime
) -> Unresolvable | None:
    """Record the call a held step's resolved inputs make and park the step for the leader;
    ``None`` once parked. Inputs that are no call fail it for good."""
    job, row = rows
    key = StepKey(row.job_id, row.step_id)
    try:
        call = child_call(inputs)
    except ChildInvalid as exc:
        return unresolvable(session, row, key, exc, now)
    session.execute(
        insert(ChildCallRow)
        .values(
            job_id=row.job_id,
            step_id=row.step_id,
            attempt=attempt,
            pipeline=call.pipeline,
            params=call.params,
            wait=call.wait,
            started=False,
            created_at=now,
        )
        .on_conflict_do_nothing()
    )
    row.status = StepStatus.AWAITING_CHILD
    row.lease_token = None
    row.lease_until = None
    record_event(
        session, job.id, "awaiting_child", {"step_id": row.step_id, "pipeline": call.pipeline}
    )
    session.execute(select(func.pg_notify(SCHEDULES_CHANNEL, "child")))
    return None


def advance_children(session: Session, now: datetime, starter: Starter) -> ChildWork:
    """One tick of the leader: send the steps whose backoff after a failed child is over,
    start the children recorded, settle the parents whose child ended, cancel the children of
    parents that ended badly; a batch of each."""
    work = ChildWork()
    _send_due(session, now, work)
    _start_calls(session, now, starter, work)
    _settle_parents(session, now, work)
    _cancel_orphans(session, now, work)
    return work


def _start_calls(session: Session, now: datetime, starter: Starter, work: ChildWork) -> None:
    calls = session.scalars(
        select(ChildCallRow)
        .where(~ChildCallRow.started)
        .order_by(ChildCallRow.created_at)
        .limit(CHILD_BATCH)
        .with_for_update(skip_locked=True)
    ).all()
    for call in calls:
        call.started = True
        parked = _parked(session, call.job_id, call.step_id, call.attempt)
        if parked is not None:
            _start(session, call, *parked, now, starter, work)


def _parked(session: Session, job_id: uuid.UUID, step_id: str, attempt: int) -> HeldRows | None:
    """The step still parked for this attempt's child, and its open job."""
    awaiting = and_(StepRunRow.status == StepStatus.AWAITING_CHILD, StepRunRow.attempts == attempt)
    return parked_rows(session, StepKey(job_id, step_id), awaiting)


def _start(
    session: Session,
    call: ChildCallRow,
    job: JobRow,
    row: StepRunRow,
    now: datetime,
    starter: Starter,
    work: ChildWork,
) -> None:
    """Start the call's child (or take the one a rerun's parent job's call ran to success), or
    fail its step for good saying why it cannot start."""
    key = StepKey(job.id, row.step_id)
    try:
        child, created = _reused(session, job, call) or _submitted(session, job, call, starter)
    except FlowbeatError as exc:
        _failed(work, job, unresolvable(session, row, key, exc, now).ready)
        return
    call.child_job_id = child.id
    record_event(
        session, job.id, "child_started", {"step_id": row.step_id, "child_job_id": str(child.id)}
    )
    if created is Outcome.NEW:
        work.started.append(child)
    if not call.wait or child.status == JobStatus.SUCCEEDED:
        output = child.result if call.wait else {"job_id": str(child.id)}
        write_checkpoint(session, key, output)
        work.ready.append(succeed_step(session, row, job_profile(job), now).at(job.priority))


def _submitted(
    session: Session, job: JobRow, call: ChildCallRow, starter: Starter
) -> tuple[JobRow, Outcome]:
    """The call's child, stored through the API's own submission under the parent's owner; a
    second submission for the same attempt finds the first (its idempotency key). A child
    pipeline's dedupe window applies: the call may take an open or recent job of it."""
    depth = job_depth(session, job.id, starter.max_depth) + 1
    if depth > starter.max_depth:
        raise PipelineDepthExceeded(
            f"{call.pipeline!r} would run {depth} levels deep; the limit is "
            f"{starter.max_depth} (FLOWBEAT_MAX_PIPELINE_DEPTH)",
            {"pipeline": call.pipeline, "depth": depth, "limit": starter.max_depth},
        )
    request = JobRequest(
        pipeline=call.pipeline,
        params=call.params,
        idempotency_key=f"pipeline.run:{job.id}:{call.step_id}:{call.attempt}",
        trigger=TRIGGER_PARENT,
    )
    with session.begin_nested():
        return submit_job(
            session,
            request,
            owner=job.owner,
            profiles_dir=starter.profiles_dir,
            known_actions=starter.known_actions,
        )


def _reused(session: Session, job: JobRow, call: ChildCallRow) -> tuple[JobRow, Outcome] | None:
    """A rerun's call takes the child that the same call of the job it reruns (or of that
    job's own parent, and so on) ran to success, rather than running it again."""
    if job.trigger != TRIGGER_RERUN or job.parent_job_id is None:
        return None
    earlier = session.scalars(
        select(JobRow)
        .join(ChildCallRow, ChildCallRow.child_job_id == JobRow.id)
        .where(
            ChildCallRow.job_id == job.parent_job_id,
            ChildCallRow.step_id == call.step_id,
            ChildCallRow.pipeline == call.pipeline,
            ChildCallRow.params == call.params,
            JobRow.status == JobStatus.SUCCEEDED,
        )
        .order_by(ChildCallRow.attempt.desc())
        .limit(1)
    ).first()
    return None if earlier is None else (earlier, Outcome.REPLAYED)


_DEPTH = """
    WITH RECURSIVE chain(caller, depth) AS (
        SELECT job_id, 1 FROM child_calls WHERE child_job_id = %(job_id)s
        UNION ALL
        SELECT c.job_id, chain.depth + 1
          FROM child_calls c JOIN chain ON c.child_job_id = chain.caller
         WHERE chain.depth <= %(limit)s
    )
    SELECT coalesce(max(depth), 0) FROM chain"""


def job_depth(session: Session, job_id: uuid.UUID, limit: int) -> int:
    """How many ``pipeline.run`` steps started this job, one inside the other (0: none),
    counted no further than past ``limit``."""
    row = driver(session).execute(_DEPTH, {"job_id": job_id, "limit": limit}).fetchone()
    return int(row[0]) if row is not None else 0


def _settle_parents(session: Session, now: datetime, work: ChildWork) -> None:
    """Waiting steps whose child ended: each settles from what its child did."""
    child = JobRow.__table__.alias("child")
    ended = session.execute(
        select(ChildCallRow.job_id, ChildCallRow.step_id, ChildCallRow.attempt)
        .join(
            StepRunRow,
            (StepRunRow.job_id == ChildCallRow.job_id)
            & (StepRunRow.step_id == ChildCallRow.step_id)
            & (StepRunRow.attempts == ChildCallRow.attempt),
        )
        .join(child, child.c.id == ChildCallRow.child_job_id)
        .where(
            StepRunRow.status == StepStatus.AWAITING_CHILD,
            StepRunRow.shard == SHARD_NONE,
            ChildCallRow.wait.is_(True),
            child.c.status.in_(list(JOB_FINAL)),
        )
        .limit(CHILD_BATCH)
    ).all()
    for job_id, step_id, attempt in ended:
        parked = _parked(session, job_id, step_id, attempt)
        call = session.get(ChildCallRow, (job_id, step_id, attempt))
        if parked is not None and call is not None and call.child_job_id is not None:
            ended_child = session.get(JobRow, call.child_job_id)
            assert ended_child is not None
            _settle(session, *parked, ended_child, now, work)


def _settle(
    session: Session, job: JobRow, row: StepRunRow, child: JobRow, now: datetime, work: ChildWork
) -> None:
    key = StepKey(job.id, row.step_id)
    profile = job_profile(job)
    if child.status == JobStatus.SUCCEEDED:
        write_checkpoint(session, key, child.result)
        work.ready.append(succeed_step(session, row, profile, now).at(job.priority))
        return
    error = _child_error(child)
    retry = profile.step(row.step_id).retry
    again = row.attempts < retry.attempts and error["code"] not in retry.non_retryable
    delay_s = retry.delay_s(row.attempts) if again else None
    failed = record_failure(session, row, key, error, delay_s, now)
    if delay_s is not None:
        _retry_after(session, job, row, delay_s, now, work)
    _failed(work, job, failed.ready)


def _retry_after(
    session: Session, job: JobRow, row: StepRunRow, delay_s: float, now: datetime, work: ChildWork
) -> None:
    """The next attempt, and so the next child, waits out the step's backoff as a worker's
    retry does, holding nothing meanwhile: the step is ``retrying`` with its ``wake_at`` and no
    message, and the leader sends it when due (``_send_due``)."""
    if delay_s <= 0:
        work.ready.append(steps_plan(job_profile(job), job.id, [row.step_id]).at(job.priority))
        return
    row.wake_at = now + timedelta(seconds=delay_s)
    record_event(
        session,
        job.id,
        "retry_at",
        {"step_id": row.step_id, "attempt": row.attempts + 1, "at": row.wake_at.isoformat()},
    )


def _send_due(session: Session, now: datetime, work: ChildWork) -> None:
    """Steps whose backoff after a failed child is over: their timer cleared, and sent, so the
    next attempt's claim records the next call. A message lost after the commit is the
    sweeper's, as any: the row is then an ordinary ``retrying`` one."""
    for job, row in due_rows(session, _BACKING_OFF, TIMED_RETRY, now, CHILD_BATCH):
        row.wake_at = None
        work.ready.append(steps_plan(job_profile(job), job.id, [row.step_id]).at(job.priority))


def next_retry(session: Session) -> datetime | None:
    """The earliest end of a backoff after a failed child, for the beat leader's sleep."""
    value: datetime | None = session.scalar(
        select(func.min(StepRunRow.wake_at)).where(_BACKING_OFF)
    )
    return value


def _child_error(child: JobRow) -> dict[str, Any]:
    """A step's error for a child that failed or was cancelled: the child's own code, so a
    retry policy's ``non_retryable`` can name it, and the child's error in full."""
    cause = child.error or {}
    return {
        "code": cause.get("code", "child_failed"),
        "message": f"child job {child.id} ({child.pipeline}) {child.status}: "
        + str(cause.get("message", "")),
        "details": {"child_job_id": str(child.id), "child_error": cause},
    }


def _failed(work: ChildWork, job: JobRow, ready: JobPlan) -> None:
    work.ready.append(ready.at(job.priority))


def _cancel_orphans(session: Session, now: datetime, work: ChildWork) -> None:
    """Open children of jobs that ended other than in success: cancelled as on a person's
    request, their running tasks revoked and their compensations run."""
    parent = JobRow.__table__.alias("parent")
    orphans = session.scalars(
        select(JobRow.id)
        .join(ChildCallRow, ChildCallRow.child_job_id == JobRow.id)
        .join(parent, parent.c.id == ChildCallRow.job_id)
        .where(
            JobRow.status.in_(list(JOB_OPEN)),
            JobRow.trigger == TRIGGER_PARENT,
            parent.c.status.in_([JobStatus.FAILED, JobStatus.CANCELLED]),
        )
        .limit(CHILD_BATCH)
    ).all()
    for child_id in orphans:
        try:
            child, running = cancel_job(session, child_id, owner=None, now=now)
        except JobConflict:
            continue
        child.error = {
            "code": "parent_ended",
            "message": "cancelled: the job that started it ended first",
            "details": {},
        }
        work.revoke.extend(running)
        if unfinished(session, child_id):
            work.compensate.append(child_id)
