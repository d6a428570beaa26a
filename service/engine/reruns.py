"""Rerunning a finished job from one of its steps, on the checkpoints it already wrote.

A rerun is a new job (``trigger: "rerun"``, ``parent_job_id``) of the parent's own profile
snapshot. The steps that are neither ``from_step`` nor downstream of it, and that succeeded in
the parent, are stored as ``reused`` with a copy of the parent's checkpoint: they are settled
from the start and never run. ``from_step`` and everything downstream run. With
``only_failed_items`` a for_each ``from_step`` keeps the items that succeeded and runs the rest.
Functions flush; the caller commits, then publishes the job's plan.
"""

import hashlib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.engine.checkpoints import copy_checkpoints
from service.engine.concurrency import WAITING_FOR_TURN, slot_values
from service.engine.dedupe import dedupe_key
from service.engine.jobs import get_job
from service.engine.signals import carry_signals
from service.engine.submission import check_open_jobs, insert_job, step_rows, take_turn
from service.language.dag import descendants
from service.language.params import resolve_params
from service.language.profiles import Profile
from service.language.snapshots import job_profile
from service.platform import tracing
from service.platform.constants import TRIGGER_RERUN
from service.platform.db import driver
from service.platform.errors import JobConflict, PipelineVersionGone, RerunInvalid, UnknownStep
from service.platform.models import JobRow, PipelineVersionRow, StepRunRow
from service.platform.states import (
    JOB_FINAL,
    STEP_SUCCESSFUL,
    STEP_SUCCESSFUL_SQL,
    JobStatus,
    StepStatus,
)


@dataclass(frozen=True)
class RerunRequest:
    from_step: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    reuse_upstream: bool = True
    only_failed_items: bool = False
    priority: int | None = None
    """``None`` keeps the parent's."""
    idempotency_key: str | None = None
    """A key of the parent's owner: a second rerun under it is refused (a bulk action's)."""


def rerun_job(
    session: Session,
    parent_id: uuid.UUID,
    request: RerunRequest,
    *,
    visible_to: str | None,
    now: datetime,
    open_jobs_limit: int = 0,
    fair_share_ahead: int = 0,
) -> JobRow:
    """Store the rerun of a finished job, owned by the parent's owner, as a queued job.

    It is a new job of that owner, so it counts against the owner's ``open_jobs_limit`` and,
    with ``fair_share_ahead``, waits its turn among the owner's jobs as a submission does."""
    parent = get_job(session, parent_id, owner=visible_to)
    if parent.status not in JOB_FINAL:
        raise JobConflict(
            f"job {parent.id} is still {parent.status}; only a finished job can be rerun",
            {"job_id": str(parent.id), "status": parent.status},
        )
    profile = job_profile(parent)
    _check_version_kept(session, parent)
    rerun = _steps_to_run(profile, request)
    reused = _reusable(session, parent, profile) - rerun
    fan_out_kept = _kept_items_step(profile, request)
    params = resolve_params(profile, {**parent.params, **request.params})
    check_open_jobs(session, parent.owner, open_jobs_limit)
    job = _job_of(parent, profile, params, request)
    job["created_at"] = job["dispatched_at"] = now
    job.update(slot_values(profile, parent.owner, params))
    job["dedupe_key"] = dedupe_key(profile, params)
    job["deadline_at"] = _deadline_of_rerun(parent, now)
    job["traceparent"] = tracing.traceparent()
    if fair_share_ahead and job["waiting_for"] is None:
        job.update(waiting_for=WAITING_FOR_TURN, dispatched_at=None)
    stored = insert_job(session, job, step_rows(profile, reused, now)).stored
    if stored is None:
        raise JobConflict(
            f"job {parent.id} was already rerun under this key",
            {"job_id": str(parent.id), "idempotency_key": request.idempotency_key},
        )
    take_turn(session, stored, fair_share_ahead, publish_now=True)
    _copy_reused(session, parent.id, job["id"], reused, fan_out_kept, now)
    carry_signals(session, parent.id, job["id"], profile, reused)
    session.flush()
    created = session.get(JobRow, job["id"])
    assert created is not None
    return created


def _check_version_kept(session: Session, parent: JobRow) -> None:
    if parent.pipeline_version is None:
        return
    kept = None
    if parent.pipeline_id is not None:
        kept = session.get(PipelineVersionRow, (parent.pipeline_id, parent.pipeline_version))
    if kept is None:
        raise PipelineVersionGone(
            f"version {parent.pipeline_version} of pipeline {parent.pipeline!r} was deleted",
            {"pipeline": parent.pipeline, "version": parent.pipeline_version},
        )


def _steps_to_run(profile: Profile, request: RerunRequest) -> set[str]:
    ids = {step.id for step in profile.steps}
    if request.from_step is None:
        return ids
    if request.from_step not in ids:
        raise UnknownStep(
            f"the pipeline has no step {request.from_step!r}",
            {"from_step": request.from_step, "steps": sorted(ids)},
        )
    if not request.reuse_upstream:
        return ids
    return {request.from_step} | descendants(profile.deps(), request.from_step)


def _reusable(session: Session, parent: JobRow, profile: Profile) -> set[str]:
    """Steps of the parent with a checkpoint to reuse; a step upstream of ``from_step`` that
    did not succeed there has none, and runs again."""
    rows = session.execute(
        select(StepRunRow.step_id, StepRunRow.status).where(
            StepRunRow.job_id == parent.id, StepRunRow.shard < 0
        )
    )
    return {step for step, status in rows if status in STEP_SUCCESSFUL}


def _kept_items_step(profile: Profile, request: RerunRequest) -> str | None:
    if not request.only_failed_items:
        return None
    if request.from_step is None or profile.step(request.from_step).for_each is None:
        raise RerunInvalid(
            "only_failed_items needs a from_step that fans out with for_each",
            {"from_step": request.from_step},
        )
    if not request.reuse_upstream:
        raise RerunInvalid(
            "only_failed_items keeps items of the parent, so its upstream must be reused too",
            {"from_step": request.from_step},
        )
    return request.from_step


def _job_of(
    parent: JobRow, profile: Profile, params: dict[str, Any], request: RerunRequest
) -> dict[str, Any]:
    return {
        "id": uuid.uuid4(),
        "owner": parent.owner,
        "pipeline": parent.pipeline,
        "profile": profile.to_json(),
        "profile_hash": parent.profile_hash,
        "params": params,
        "labels": parent.labels,
        "status": JobStatus.QUEUED,
        "trigger": TRIGGER_RERUN,
        "priority": parent.priority if request.priority is None else request.priority,
        "queue": parent.queue,
        "parent_job_id": parent.id,
        "idempotency_key": request.idempotency_key,
        "request_hash": hashlib.sha256(f"rerun of {parent.id}".encode()).hexdigest(),
        "diff_mode": parent.diff_mode,
        "refresh": parent.refresh,
        "notify_url": parent.notify_url,
        "pipeline_id": parent.pipeline_id,
        "pipeline_version": parent.pipeline_version,
        "schedule_id": None,
        "scheduled_for": None,
    }


def _deadline_of_rerun(parent: JobRow, now: datetime) -> datetime | None:
    """A rerun has the time its parent had, from its own start: the parent's deadline may
    have come from its schedule rather than its profile, and a rerun keeps what it ran under."""
    if parent.deadline_at is None:
        return None
    return now + (parent.deadline_at - parent.created_at)


_COPY_SUCCEEDED_ITEMS = f"""
    INSERT INTO step_runs (job_id, step_id, shard, status, attempts, item, depends_on,
                           inputs_from, finished_at, output)
    SELECT %(job)s, s.step_id, s.shard, '{StepStatus.REUSED}', 0, s.item, s.depends_on,
           s.inputs_from, %(now)s, s.output
      FROM step_runs AS s
     WHERE s.job_id = %(parent)s AND s.step_id = %(items_of)s AND s.shard >= 0
       AND s.status IN {STEP_SUCCESSFUL_SQL}
    """
"""Items that succeeded become reused shards of the new job, their checkpoints with them;
when the step fans out, its insert of one shard per item skips the shards already there, so
only the rest run."""


def _copy_reused(
    session: Session,
    parent_id: uuid.UUID,
    job_id: uuid.UUID,
    reused: set[str],
    items_of: str | None,
    now: datetime,
) -> None:
    conn = driver(session)
    copy_checkpoints(conn, parent_id, job_id, reused)
    if items_of is not None:
        values = {"job": job_id, "parent": parent_id, "items_of": items_of, "now": now}
        conn.execute(_COPY_SUCCEEDED_ITEMS, values)
