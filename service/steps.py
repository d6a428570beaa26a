"""Step state transitions in PostgreSQL: claim, checkpoint, fail, fan out, settle the job.

Each function runs inside the caller's transaction and locks the step row it changes, so two
deliveries of the same message cannot both run a step, and a checkpoint is written once.
"""

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, or_, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from service.constants import SHARD_NONE, WAIT_FOR_PEER_MAX_S
from service.errors import ExpressionError, RetryLater, StopChain
from service.expressions import ExprContext, parse_refs, resolve
from service.models import CheckpointRow, JobRow, StepRunRow
from service.profiles import Profile, RetryPolicy, StepSpec
from service.states import JOB_FINAL, STEP_FINAL, JobStatus, StepStatus


@dataclass(frozen=True)
class StepKey:
    job_id: uuid.UUID
    step_id: str
    shard: int = SHARD_NONE


@dataclass(frozen=True)
class Lease:
    token: str
    attempt: int


@dataclass(frozen=True)
class Claimed:
    """A step this worker now holds: run ``action`` with ``inputs``."""

    key: StepKey
    lease: Lease
    action: str
    inputs: dict[str, Any]
    params: dict[str, Any]
    retry: RetryPolicy


@dataclass(frozen=True)
class Unresolvable:
    """The step's references cannot resolve; it was failed for good in the same transaction."""

    key: StepKey
    job_over: bool


@dataclass(frozen=True)
class FannedOut:
    """A for_each step whose shards are recorded; run them, then ``finish_fanout``."""

    key: StepKey
    shards: list[int]
    max_parallel: int
    timeout_s: int


_PROFILE_CACHE: dict[str, Profile] = {}
_PROFILE_CACHE_SIZE = 256


def job_profile(job: JobRow) -> Profile:
    """The job's profile snapshot, parsed once per process for each content hash."""
    profile = _PROFILE_CACHE.get(job.profile_hash)
    if profile is None:
        if len(_PROFILE_CACHE) >= _PROFILE_CACHE_SIZE:
            _PROFILE_CACHE.clear()
        profile = _PROFILE_CACHE[job.profile_hash] = Profile.model_validate(job.profile)
    return profile


def _lock_step(session: Session, key: StepKey) -> StepRunRow:
    row = session.scalars(
        select(StepRunRow)
        .where(
            StepRunRow.job_id == key.job_id,
            StepRunRow.step_id == key.step_id,
            StepRunRow.shard == key.shard,
        )
        .with_for_update()
    ).one_or_none()
    if row is None:
        raise StopChain(f"no step {key}")
    return row


def _live_job(session: Session, job_id: uuid.UUID) -> JobRow:
    job = session.get(JobRow, job_id)
    if job is None or job.status in JOB_FINAL:
        raise StopChain(f"job {job_id} is over")
    return job


def _wait_for_peer(row: StepRunRow, now: datetime) -> None:
    """Someone else holds this step: come back once their lease could have lapsed."""
    if row.status == StepStatus.RUNNING and (row.lease_until is None or row.lease_until > now):
        remaining = (row.lease_until - now).total_seconds() if row.lease_until else 1.0
        raise RetryLater(min(max(remaining, 0.2), WAIT_FOR_PEER_MAX_S), "held by a live lease")


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


def _outputs(session: Session, job_id: uuid.UUID, step_ids: set[str]) -> dict[str, Any]:
    if not step_ids:
        return {}
    rows = session.execute(
        select(CheckpointRow.step_id, CheckpointRow.output).where(
            CheckpointRow.job_id == job_id,
            CheckpointRow.shard == SHARD_NONE,
            CheckpointRow.step_id.in_(step_ids),
        )
    )
    return {step_id: output for step_id, output in rows}


def _referenced_steps(value: Any) -> set[str]:
    return {ref.name for ref in parse_refs(value) if ref.root == "steps" and ref.name}


def _take_lease(row: StepRunRow, job: JobRow, task_id: str, lease_s: float, now: datetime) -> Lease:
    row.status = StepStatus.RUNNING
    row.attempts += 1
    row.lease_token = uuid.uuid4().hex
    row.lease_until = now + timedelta(seconds=lease_s)
    row.task_id = task_id
    row.started_at = now
    row.error = None
    if job.status == JobStatus.QUEUED:
        job.status = JobStatus.RUNNING
        job.started_at = now
    return Lease(token=row.lease_token, attempt=row.attempts)


def claim_step(
    session: Session, key: StepKey, *, task_id: str, lease_s: float, now: datetime
) -> Claimed | FannedOut | Unresolvable | None:
    """Take a step (or shard) for this worker. ``None`` means it is already settled."""
    job = _live_job(session, key.job_id)
    return _claim_row(session, job, _lock_step(session, key), task_id, lease_s, now)


def claim_next_shard(
    session: Session, parent: StepKey, *, task_id: str, lease_s: float, now: datetime
) -> Claimed | Unresolvable | None:
    """Take any open shard of a fanned-out step that no other lane holds; ``None`` if none."""
    job = _live_job(session, parent.job_id)
    row = session.scalars(
        select(StepRunRow)
        .where(
            StepRunRow.job_id == parent.job_id,
            StepRunRow.step_id == parent.step_id,
            StepRunRow.shard >= 0,
            or_(
                StepRunRow.status.in_([StepStatus.PENDING, StepStatus.RETRYING]),
                and_(StepRunRow.status == StepStatus.RUNNING, StepRunRow.lease_until < now),
            ),
        )
        .order_by(StepRunRow.shard)
        .limit(1)
        .with_for_update(skip_locked=True)
    ).one_or_none()
    if row is None:
        return None
    claim = _claim_row(session, job, row, task_id, lease_s, now)
    assert not isinstance(claim, FannedOut)
    return claim


def _claim_row(
    session: Session, job: JobRow, row: StepRunRow, task_id: str, lease_s: float, now: datetime
) -> Claimed | FannedOut | Unresolvable | None:
    key = StepKey(row.job_id, row.step_id, row.shard)
    if row.status in STEP_FINAL:
        return None
    _wait_for_peer(row, now)
    spec = job_profile(job).step(key.step_id)
    if key.shard == SHARD_NONE and not _upstream_succeeded(session, row, spec, now):
        return None
    lease = _take_lease(row, job, task_id, lease_s, now)
    try:
        if spec.for_each is not None and key.shard == SHARD_NONE:
            return _fan_out(session, job, row, spec, now)
        inputs = _resolve_inputs(session, job, row, spec)
    except ExpressionError as exc:
        error = {"code": exc.code, "message": exc.message, "details": exc.details}
        return Unresolvable(key, _record_failure(session, row, key, error, None, now))
    return Claimed(
        key=key,
        lease=lease,
        action=spec.action,
        inputs=inputs,
        params=dict(job.params),
        retry=spec.retry,
    )


def _upstream_succeeded(session: Session, row: StepRunRow, spec: StepSpec, now: datetime) -> bool:
    """Wait for unsettled upstream steps; skip this one when any of them did not succeed."""
    upstream = _upstream_statuses(session, row.job_id, spec.depends_on)
    if any(status not in STEP_FINAL for status in upstream):
        raise RetryLater(1.0, "upstream steps are not settled")
    if all(status == StepStatus.SUCCEEDED for status in upstream):
        return True
    _skip(row, now)
    settle_job(session, row.job_id, now)
    return False


def _resolve_inputs(
    session: Session, job: JobRow, row: StepRunRow, spec: StepSpec
) -> dict[str, Any]:
    outputs = _outputs(session, job.id, _referenced_steps(spec.with_))
    if row.shard == SHARD_NONE:
        context = ExprContext(params=job.params, outputs=outputs)
    else:
        context = ExprContext(params=job.params, outputs=outputs, item=row.item)
    resolved: dict[str, Any] = resolve(spec.with_, context)
    return resolved


def _fan_out(
    session: Session, job: JobRow, row: StepRunRow, spec: StepSpec, now: datetime
) -> FannedOut | None:
    assert spec.for_each is not None
    outputs = _outputs(session, job.id, _referenced_steps(spec.for_each.items))
    items = resolve(spec.for_each.items, ExprContext(params=job.params, outputs=outputs))
    if not isinstance(items, list):
        raise ExpressionError(
            f"for_each.items of step {spec.id!r} is not a list",
            {"expression": spec.for_each.items, "reason": f"got {type(items).__name__}"},
        )
    key = StepKey(job.id, spec.id)
    if not items:
        _write_checkpoint(session, key, row.attempts, [])
        _succeed(row, now)
        settle_job(session, job.id, now)
        return None
    session.execute(
        insert(StepRunRow)
        .values(
            [
                {
                    "job_id": job.id,
                    "step_id": spec.id,
                    "shard": index,
                    "status": StepStatus.PENDING,
                    "attempts": 0,
                    "item": item,
                }
                for index, item in enumerate(items)
            ]
        )
        .on_conflict_do_nothing()
    )
    row.lease_until = None
    return FannedOut(
        key=key,
        shards=pending_shards(session, key),
        max_parallel=spec.for_each.max_parallel,
        timeout_s=spec.timeout_s,
    )


def pending_shards(session: Session, key: StepKey) -> list[int]:
    return list(
        session.scalars(
            select(StepRunRow.shard)
            .where(
                StepRunRow.job_id == key.job_id,
                StepRunRow.step_id == key.step_id,
                StepRunRow.shard >= 0,
                StepRunRow.status.not_in(list(STEP_FINAL)),
            )
            .order_by(StepRunRow.shard)
        )
    )


def _write_checkpoint(session: Session, key: StepKey, attempt: int, output: Any) -> None:
    session.execute(
        insert(CheckpointRow)
        .values(
            job_id=key.job_id,
            step_id=key.step_id,
            shard=key.shard,
            attempt=attempt,
            output=output,
        )
        .on_conflict_do_nothing()
    )


def _succeed(row: StepRunRow, now: datetime) -> None:
    row.status = StepStatus.SUCCEEDED
    row.finished_at = now
    row.lease_token = None
    row.lease_until = None


def _skip(row: StepRunRow, now: datetime) -> None:
    row.status = StepStatus.SKIPPED
    row.finished_at = now


def holds_lease(row: StepRunRow, lease: Lease) -> bool:
    return row.status == StepStatus.RUNNING and row.lease_token == lease.token


def complete_step(session: Session, key: StepKey, lease: Lease, output: Any, now: datetime) -> None:
    """Checkpoint a finished attempt, unless its lease was lost to another worker meanwhile."""
    row = _lock_step(session, key)
    if not holds_lease(row, lease):
        return
    _write_checkpoint(session, key, lease.attempt, output)
    _succeed(row, now)
    if key.shard == SHARD_NONE:
        settle_job(session, key.job_id, now)


def finish_fanout(session: Session, key: StepKey, now: datetime) -> None:
    """The chord body of a for_each step: gather shard outputs in item order."""
    _live_job(session, key.job_id)
    row = _lock_step(session, key)
    if row.status in STEP_FINAL:
        return
    if pending_shards(session, key):
        raise RetryLater(1.0, "shards are not settled")
    outputs = session.scalars(
        select(CheckpointRow.output)
        .where(
            CheckpointRow.job_id == key.job_id,
            CheckpointRow.step_id == key.step_id,
            CheckpointRow.shard >= 0,
        )
        .order_by(CheckpointRow.shard)
    )
    _write_checkpoint(session, key, row.attempts, list(outputs))
    _succeed(row, now)
    settle_job(session, key.job_id, now)


def settle_job(session: Session, job_id: uuid.UUID, now: datetime) -> None:
    """Finish the job once every step is settled; the job row lock serialises the last steps."""
    job = session.scalars(select(JobRow).where(JobRow.id == job_id).with_for_update()).one()
    if job.status in JOB_FINAL:
        return
    rows = session.execute(
        select(StepRunRow.step_id, StepRunRow.status).where(
            StepRunRow.job_id == job_id, StepRunRow.shard == SHARD_NONE
        )
    )
    statuses = {step_id: status for step_id, status in rows}
    if any(status not in STEP_FINAL for status in statuses.values()):
        return
    profile = job_profile(job)
    job.finished_at = now
    outcome = result_of(session, job, profile, statuses)
    if outcome is None:
        failed = sorted(step for step, status in statuses.items() if status != StepStatus.SUCCEEDED)
        job.status = JobStatus.FAILED
        job.error = job.error or {
            "code": "steps_failed",
            "message": f"steps did not succeed: {', '.join(failed)}",
            "details": {"steps": failed},
        }
    else:
        job.status = JobStatus.SUCCEEDED
        job.result = outcome


def result_of(
    session: Session, job: JobRow, profile: Profile, statuses: dict[str, str]
) -> Any | None:
    """The job's result, or ``None`` when the steps that make it did not all succeed."""
    sinks = [step for step in statuses if not any(step in s.depends_on for s in profile.steps)]
    needed = [profile.result.step] if profile.result else sinks
    if any(statuses[step] != StepStatus.SUCCEEDED for step in needed):
        return None
    outputs = _outputs(session, job.id, set(needed))
    if profile.result is None:
        return {step: outputs[step] for step in needed}
    items = resolve_path(outputs[profile.result.step], profile.result.items)
    return {"items": items, "key": profile.result.key, "count": len(items)}


def resolve_path(value: Any, path: str) -> Any:
    for part in [p for p in path.split(".") if p]:
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


def fail_step(
    session: Session,
    key: StepKey,
    lease: Lease,
    error: dict[str, Any],
    *,
    retry_delay_s: float | None,
    now: datetime,
) -> bool:
    """Record a failed attempt: back to ``retrying``, or failed for good under the job's policy.

    Returns whether the job is over. A worker that lost its lease records nothing.
    """
    row = _lock_step(session, key)
    if not holds_lease(row, lease):
        return False
    return _record_failure(session, row, key, error, retry_delay_s, now)


def _record_failure(
    session: Session,
    row: StepRunRow,
    key: StepKey,
    error: dict[str, Any],
    retry_delay_s: float | None,
    now: datetime,
) -> bool:
    row.error = error
    row.lease_token = None
    row.lease_until = None
    if retry_delay_s is not None:
        row.status = StepStatus.RETRYING
        return False
    row.status = StepStatus.FAILED
    row.finished_at = now
    job = session.scalars(select(JobRow).where(JobRow.id == key.job_id).with_for_update()).one()
    if job.status in JOB_FINAL:
        return True
    profile = job_profile(job)
    if profile.failure_policy == "fail_fast":
        _fail_job(session, job, key, error, now)
        return True
    if key.shard == SHARD_NONE:
        _skip_dependents(session, profile, key, now)
        settle_job(session, key.job_id, now)
    return job.status in JOB_FINAL


def _fail_job(
    session: Session, job: JobRow, key: StepKey, error: dict[str, Any], now: datetime
) -> None:
    where = f"step {key.step_id!r}" + (f" item {key.shard}" if key.shard != SHARD_NONE else "")
    job.status = JobStatus.FAILED
    job.finished_at = now
    job.error = {
        "code": error.get("code", "step_failed"),
        "message": f"{where} failed: {error.get('message', '')}",
        "details": {"step_id": key.step_id, "shard": None if key.shard < 0 else key.shard},
    }
    close_open_steps(session, job.id, StepStatus.CANCELLED, now)


def close_open_steps(
    session: Session, job_id: uuid.UUID, status: StepStatus, now: datetime
) -> None:
    session.execute(
        update(StepRunRow)
        .where(StepRunRow.job_id == job_id, StepRunRow.status.not_in(list(STEP_FINAL)))
        .values(status=status, finished_at=now, lease_token=None, lease_until=None)
    )


def _skip_dependents(session: Session, profile: Profile, key: StepKey, now: datetime) -> None:
    doomed: set[str] = set()
    frontier = {key.step_id}
    while frontier:
        frontier = {s.id for s in profile.steps if frontier & set(s.depends_on)} - doomed
        doomed |= frontier
    if doomed:
        session.execute(
            update(StepRunRow)
            .where(
                StepRunRow.job_id == key.job_id,
                StepRunRow.step_id.in_(doomed),
                StepRunRow.status.not_in(list(STEP_FINAL)),
            )
            .values(status=StepStatus.SKIPPED, finished_at=now)
        )


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
