"""What of a job can be sent now: the steps whose upstream is settled and that are not.

A job's first message carries its root steps; from then on each step that settles sends the
steps it was the last upstream of (``engine.completion.release_children``), so a step starts as
soon as its own upstream is done, whatever else runs. The same frontier, read from PostgreSQL,
is what the sweeper re-publishes when the broker lost messages, never what the broker
remembers.
"""

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.language.profiles import Profile
from service.language.snapshots import job_profile
from service.platform.constants import DEFAULT_QUEUE, SHARD_NONE
from service.platform.models import JobRow, StepRunRow
from service.platform.states import JOB_FINAL, STEP_FINAL, STEP_PARKED, StepStatus


@dataclass(frozen=True)
class StepPlan:
    step_id: str
    timeout_s: int
    shards: list[int] | None = None
    max_parallel: int = 1
    queue: str = DEFAULT_QUEUE


@dataclass(frozen=True)
class JobPlan:
    job_id: uuid.UUID
    steps: list[StepPlan] = field(default_factory=list)
    compensate: bool = False
    """The job ended with compensations to run (a saga): send the task that runs them."""
    pipeline: str | None = field(default=None, compare=False)
    """The job's pipeline, for the names its messages show in Flower and worker logs only; a
    label, so two plans of the same steps are equal with or without it."""
    priority: int = 0
    """The job's: its messages go to their queue's list for it, higher taken first."""
    trace: str | None = field(default=None, compare=False)
    """The ``traceparent`` its messages carry when it was made outside the span they continue
    (a batch of jobs sent together, each in its own trace); none: the current span's."""

    def at(self, priority: int) -> "JobPlan":
        return self if priority == self.priority else replace(self, priority=priority)


def steps_plan(profile: Profile, job_id: uuid.UUID, step_ids: Iterable[str]) -> JobPlan:
    """Messages for steps that have just become ready, in profile order. At the job's
    priority only where the caller read it (``JobPlan.at``): a step that settles sends its
    children at the priority of the message it came in."""
    wanted = set(step_ids)
    return JobPlan(
        job_id=job_id,
        steps=[
            StepPlan(s.id, s.timeout_s, queue=s.queue or profile.queue)
            for s in profile.steps
            if s.id in wanted
        ],
        pipeline=profile.name,
    )


def initial_plan(
    profile: Profile, job_id: uuid.UUID, priority: int, trace: str | None = None
) -> JobPlan:
    """The root steps of a job that has not started yet."""
    roots = (s.id for s in profile.steps if not s.depends_on)
    plan = steps_plan(profile, job_id, roots).at(priority)
    return plan if trace is None else replace(plan, trace=trace)


def plan_remaining(
    profile: Profile, job_id: uuid.UUID, rows: list[StepRunRow], priority: int
) -> JobPlan:
    """Unsettled steps with a settled upstream, but for those parked (at their gate, asleep until
    their time, for a slot, for a signal or a child, or backing off before their next child,
    which the beat leader sends); a fanned-out step carries its open shards."""
    open_shards: dict[str, list[int]] = {}
    for row in rows:
        if row.shard != SHARD_NONE and row.status not in STEP_FINAL:
            open_shards.setdefault(row.step_id, []).append(row.shard)
    ready = {
        row.step_id: row
        for row in rows
        if row.shard == SHARD_NONE
        and row.status not in STEP_FINAL
        and row.status not in STEP_PARKED
        and not (row.status == StepStatus.RETRYING and row.wake_at is not None)
        and row.waiting_on == 0
    }
    return JobPlan(
        job_id=job_id,
        steps=[
            _plan_step(profile, s.id, ready[s.id], sorted(open_shards.get(s.id, [])))
            for s in profile.steps
            if s.id in ready
        ],
        pipeline=profile.name,
        priority=priority,
    )


def _plan_step(profile: Profile, step_id: str, row: StepRunRow, shards: list[int]) -> StepPlan:
    spec = profile.step(step_id)
    fanned_out = (
        spec.for_each is not None and row.status == StepStatus.RUNNING and row.lease_until is None
    )
    queue = profile.queue_of(step_id)
    if not fanned_out:
        return StepPlan(step_id=step_id, timeout_s=spec.timeout_s, queue=queue)
    assert spec.for_each is not None
    return StepPlan(
        step_id=step_id,
        timeout_s=spec.timeout_s,
        shards=shards,
        max_parallel=spec.for_each.max_parallel,
        queue=queue,
    )


def load_plan(session: Session, job_id: uuid.UUID) -> JobPlan | None:
    """The plan of a job that is still open, or ``None`` when it is over."""
    job = session.get(JobRow, job_id)
    if job is None or job.status in JOB_FINAL:
        return None
    rows = list(session.scalars(select(StepRunRow).where(StepRunRow.job_id == job_id)))
    plan = plan_remaining(job_profile(job), job_id, rows, job.priority)
    return replace(plan, trace=job.traceparent)
