"""Finishing a job: once its steps are settled, its status, result and result items.

The last steps of a job may finish at once on different workers; the job row lock makes one of
them the one that settles it.
"""

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from service.catalogue.diffs import key_problem, store_result_items
from service.catalogue.notices import note_new_items
from service.engine.checkpoints import step_outputs
from service.language.profiles import Profile
from service.language.snapshots import job_profile, step_facts
from service.platform import metrics
from service.platform.constants import SHARD_NONE
from service.platform.models import JobRow, StepRunRow
from service.platform.states import JOB_FINAL, STEP_FINAL, STEP_SUCCESSFUL, JobStatus, StepStatus

_NOT_FAILED = STEP_SUCCESSFUL | {StepStatus.SKIPPED}


def sink_settles_job(profile: Profile, step_id: str) -> bool:
    """Whether the checkpoint of ``step_id`` may succeed the job in the same statement.

    It may when this step is the job's only sink and the job fails fast with no result items:
    every other step has then succeeded or been skipped by its condition, and the result is
    this step's output. In
    every other case (another sink holds the result, a best-effort job may end with failures,
    result items must be stored) ``settle_job`` decides.
    """
    if profile.failure_policy != "fail_fast" or profile.result is not None:
        return False
    return [s.id for s in profile.steps if step_facts(profile, s.id).sink] == [step_id]


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
    _settle(session, job, profile, statuses)
    metrics.job_finished(session, job.pipeline, job.trigger, job.status)


def _settle(session: Session, job: JobRow, profile: Profile, statuses: dict[str, str]) -> None:
    outcome = result_of(session, job, profile, statuses)
    if outcome is None:
        failed = sorted(step for step, status in statuses.items() if status not in _NOT_FAILED)
        if not failed and profile.result is not None:
            failed = [profile.result.step]
        job.status = JobStatus.FAILED
        job.error = job.error or {
            "code": "steps_failed",
            "message": f"steps did not succeed: {', '.join(failed)}",
            "details": {"steps": failed},
        }
    else:
        _succeed_job(session, job, profile, outcome)


def _succeed_job(session: Session, job: JobRow, profile: Profile, outcome: Any) -> None:
    """Succeed the job and store its result items with it, or fail it if they are unusable."""
    spec = profile.result
    problem = key_problem(outcome["items"], spec) if spec is not None else None
    if problem is not None:
        job.status = JobStatus.FAILED
        job.error = problem
        return
    if spec is not None:
        counts = store_result_items(session, job, spec)
        if job.diff_mode and counts.new == 0:
            outcome = {**outcome, "no_new_items": True}
        elif job.diff_mode:
            note_new_items(session, job, counts)
    job.status = JobStatus.SUCCEEDED
    job.result = outcome


def result_of(
    session: Session, job: JobRow, profile: Profile, statuses: dict[str, str]
) -> Any | None:
    """The job's result, or ``None`` when the job did not succeed.

    With a ``result`` block the job succeeds when its result step did (under ``best_effort``
    other branches may have failed). Without one it succeeds when no step failed; a step
    skipped by its condition or ``needs`` rule is no failure, and the result holds the outputs
    of the sinks that ran.
    """
    if profile.result is None:
        if any(status not in _NOT_FAILED for status in statuses.values()):
            return None
        sinks = [s.id for s in profile.steps if step_facts(profile, s.id).sink]
        ran = {step for step in sinks if statuses[step] in STEP_SUCCESSFUL}
        outputs = step_outputs(session, job.id, ran)
        return {step: outputs[step] for step in sinks if step in ran}
    if statuses[profile.result.step] not in STEP_SUCCESSFUL:
        return None
    outputs = step_outputs(session, job.id, {profile.result.step})
    items = resolve_path(outputs[profile.result.step], profile.result.items)
    return {"items": items, "key": profile.result.key, "count": len(items)}


def resolve_path(value: Any, path: str) -> Any:
    for part in [p for p in path.split(".") if p]:
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


def close_open_steps(
    session: Session, job_id: uuid.UUID, status: StepStatus, now: datetime
) -> None:
    session.execute(
        update(StepRunRow)
        .where(StepRunRow.job_id == job_id, StepRunRow.status.not_in(list(STEP_FINAL)))
        .values(status=status, finished_at=now, lease_token=None, lease_until=None)
    )
