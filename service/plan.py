"""What is left to run of a job, as layers of steps: the shape the task layer turns into a canvas.

Used for the first dispatch and again by the sweeper, so a job whose messages were lost is
re-published from what PostgreSQL says is unfinished, never from what the broker remembers.
"""

import uuid
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.constants import SHARD_NONE
from service.models import JobRow, StepRunRow
from service.profiles import Profile
from service.snapshots import job_profile
from service.states import JOB_FINAL, STEP_FINAL, StepStatus


@dataclass(frozen=True)
class StepPlan:
    step_id: str
    timeout_s: int
    shards: list[int] | None = None
    max_parallel: int = 1


@dataclass(frozen=True)
class JobPlan:
    job_id: uuid.UUID
    layers: list[list[StepPlan]] = field(default_factory=list)


def plan_remaining(profile: Profile, job_id: uuid.UUID, rows: list[StepRunRow]) -> JobPlan:
    """Unsettled steps in dependency layers; a fanned-out step carries its unsettled shards."""
    steps = {row.step_id: row for row in rows if row.shard == SHARD_NONE}
    open_shards: dict[str, list[int]] = {}
    for row in rows:
        if row.shard != SHARD_NONE and row.status not in STEP_FINAL:
            open_shards.setdefault(row.step_id, []).append(row.shard)
    layers: list[list[StepPlan]] = []
    for layer in profile.layers():
        planned = [
            _plan_step(profile, step_id, steps[step_id], sorted(open_shards.get(step_id, [])))
            for step_id in layer
            if steps[step_id].status not in STEP_FINAL
        ]
        if planned:
            layers.append(planned)
    return JobPlan(job_id=job_id, layers=layers)


def _plan_step(profile: Profile, step_id: str, row: StepRunRow, shards: list[int]) -> StepPlan:
    spec = profile.step(step_id)
    fanned_out = (
        spec.for_each is not None and row.status == StepStatus.RUNNING and row.lease_until is None
    )
    if not fanned_out:
        return StepPlan(step_id=step_id, timeout_s=spec.timeout_s)
    assert spec.for_each is not None
    return StepPlan(
        step_id=step_id,
        timeout_s=spec.timeout_s,
        shards=shards,
        max_parallel=spec.for_each.max_parallel,
    )


def initial_plan(profile: Profile, job_id: uuid.UUID) -> JobPlan:
    """Every step of a job that has not started yet."""
    layers = [
        [StepPlan(step_id=step_id, timeout_s=profile.step(step_id).timeout_s) for step_id in layer]
        for layer in profile.layers()
    ]
    return JobPlan(job_id=job_id, layers=layers)


def load_plan(session: Session, job_id: uuid.UUID) -> JobPlan | None:
    """The plan of a job that is still open, or ``None`` when it is over."""
    job = session.get(JobRow, job_id)
    if job is None or job.status in JOB_FINAL:
        return None
    rows = list(session.scalars(select(StepRunRow).where(StepRunRow.job_id == job_id)))
    return plan_remaining(job_profile(job), job_id, rows)
