"""Settling a step other than by its checkpoint's own statement, in the caller's transaction and
on the step row it locked: a failure recorded for a retry or for good, a step skipped, a step
whose checkpoint the transaction wrote marked succeeded.

Every transition that settles a step also counts it off its children's ``waiting_on`` and hands
back the children it was the last upstream of, for the caller to send once it has committed;
since it runs in the transaction that settled the step, that happens once per settling.
"""

from dataclasses import dataclass
from datetime import datetime
from typing import Any, overload

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.engine.compensations import record_compensations
from service.engine.leases import held_step, lock_step
from service.engine.settle import close_open_steps, settle_job
from service.engine.steps import Lease, Skipped, StepKey, Unresolvable
from service.language.plan import JobPlan, steps_plan
from service.language.profiles import Profile
from service.language.snapshots import job_profile, step_facts
from service.platform import metrics
from service.platform.constants import SHARD_NONE
from service.platform.db import driver
from service.platform.errors import FlowbeatError
from service.platform.models import JobRow, StepRunRow
from service.platform.states import JOB_FINAL, JobStatus, StepStatus


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
    row = held_step(session, key, lease)
    if row is None:
        return Failed(False, JobPlan(key.job_id), recorded=False)
    return record_failure(session, row, key, error, retry_delay_s, now)


def unresolvable(
    session: Session, row: StepRunRow, key: StepKey, exc: FlowbeatError, now: datetime
) -> Unresolvable:
    """Fail a held step for good because what it runs with cannot be made: its inputs, its
    condition or its items do not resolve, or there are too many items."""
    error = {"code": exc.code, "message": exc.message, "details": exc.details}
    failed = record_failure(session, row, key, error, None, now)
    return Unresolvable(key, failed.job_over, failed.ready)


@overload
def not_run(session: Session, key: StepKey, profile: Profile, now: datetime) -> Skipped: ...
@overload
def not_run(
    session: Session, key: StepKey, profile: Profile, now: datetime, unresolved: FlowbeatError
) -> Unresolvable: ...
def not_run(
    session: Session,
    key: StepKey,
    profile: Profile,
    now: datetime,
    unresolved: FlowbeatError | None = None,
) -> Skipped | Unresolvable:
    """Settle a held step that will not run, under its row lock: failed for good when what it
    runs with does not resolve, otherwise skipped (its ``when``), its attempt given back."""
    row = lock_step(session, key)
    if unresolved is not None:
        return unresolvable(session, row, key, unresolved, now)
    row.attempts -= 1
    return skip_step(session, row, profile, now)


def record_failure(
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


def skip_step(session: Session, row: StepRunRow, profile: Profile, now: datetime) -> Skipped:
    """Settle a step without running it; its children count it as settled."""
    row.status = StepStatus.SKIPPED
    row.finished_at = now
    row.lease_token = None
    row.lease_until = None
    key = StepKey(row.job_id, row.step_id)
    ready = release_children(session, key, profile)
    settle_job(session, row.job_id, now)
    return Skipped(key, ready)


def mark_succeeded(row: StepRunRow, now: datetime) -> None:
    """The ORM's form of the update in ``checkpoints.complete_step``, for a step whose
    checkpoint its transaction wrote and whose row it holds."""
    row.status = StepStatus.SUCCEEDED
    row.finished_at = now
    row.lease_token = None
    row.lease_until = None


def succeed_step(session: Session, row: StepRunRow, profile: Profile, now: datetime) -> JobPlan:
    """Succeed a step whose checkpoint this transaction wrote, count it off its children, and
    settle its job if it was the last."""
    mark_succeeded(row, now)
    ready = release_children(session, StepKey(row.job_id, row.step_id), profile)
    settle_job(session, row.job_id, now)
    return ready


_RELEASE_CHILDREN = """
    UPDATE step_runs SET waiting_on = waiting_on - 1
     WHERE job_id = %(job_id)s AND step_id = ANY(%(children)s) AND shard = -1
    RETURNING step_id, waiting_on
    """


def release_children(session: Session, key: StepKey, profile: Profile) -> JobPlan:
    """Count a settled step off its children; the ones it was the last upstream of are ready."""
    children = step_facts(profile, key.step_id).children
    if not children or key.shard != SHARD_NONE:
        return JobPlan(key.job_id)
    rows = driver(session).execute(
        _RELEASE_CHILDREN, {"job_id": key.job_id, "children": list(children)}
    )
    return steps_plan(profile, key.job_id, (step for step, left in rows if left == 0))
