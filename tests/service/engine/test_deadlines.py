"""Job deadlines in PostgreSQL: a job still open at its deadline is failed as job_timeout, its
running step's checkpoint is refused, its waiting steps never start and its compensations are
due; a job that finished in time, or whose deadline is still ahead, is left alone."""

import uuid
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from service.catalogue.saving import save_pipeline
from service.engine.checkpoints import complete_step
from service.engine.claims import fast_claim
from service.engine.deadlines import JOB_TIMEOUT, Expired, expire_deadlines, next_deadline
from service.engine.reruns import RerunRequest, rerun_job
from service.engine.runner import run_step
from service.engine.runtime import Runtime
from service.engine.steps import StepKey
from service.engine.submission import JobRequest, submit_job
from service.language.checks import validate_profile
from service.language.cron import ScheduleSpec
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from service.platform.errors import StopChain
from service.platform.models import CompensationRow, JobRow, StepRunRow
from service.platform.states import CompensationStatus, JobStatus, StepStatus
from service.triggers.firing import fire_schedule
from service.triggers.schedules import put_schedule
from tests.support.arrange import walk
from tests.support.fanouts import submitted

LEASE_S = 600.0
ACTIONS = frozenset({"noop", "drill.undo"})


def saga(timeout_s: int | None = 60) -> dict[str, Any]:
    """extract (undone by drill.undo) -> slow -> after, with a deadline of ``timeout_s``."""
    profile: dict[str, Any] = {
        "name": "deadline-saga",
        "steps": [
            {
                "id": "extract",
                "action": "noop",
                "compensate": {"action": "drill.undo", "with": {"name": "undo-extract"}},
            },
            {"id": "slow", "action": "noop", "depends_on": ["extract"]},
            {"id": "after", "action": "noop", "depends_on": ["slow"]},
        ],
    }
    if timeout_s is not None:
        profile["timeout_s"] = timeout_s
    return profile


def _job(rt: Runtime, job_id: uuid.UUID) -> JobRow:
    with unit_of_work(rt.sessions) as session:
        job = session.get(JobRow, job_id)
        assert job is not None
        session.expunge(job)
        return job


def _steps(rt: Runtime, job_id: uuid.UUID) -> dict[str, str]:
    with unit_of_work(rt.sessions) as session:
        rows = session.execute(
            select(StepRunRow.step_id, StepRunRow.status).where(StepRunRow.job_id == job_id)
        )
        return {step_id: status for step_id, status in rows}


def _expire(rt: Runtime, after_s: float) -> Expired:
    with unit_of_work(rt.sessions) as session:
        return expire_deadlines(session, utcnow() + timedelta(seconds=after_s))


def test_a_job_past_its_deadline_fails_its_running_step_writes_nothing_and_the_rest_never_start(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    job_id = submitted(runtime, saga(timeout_s=60), {})
    leftovers.append(job_id)
    run_step(runtime, StepKey(job_id, "extract"), task_id=uuid.uuid4().hex)
    slow = StepKey(job_id, "slow")
    with runtime.claims.connect() as conn:
        claim = fast_claim(conn, slow, task_id="task-of-slow", lease_s=LEASE_S, now=utcnow())
    assert claim is not None

    assert job_id not in _expire(runtime, after_s=30).failed
    expired = _expire(runtime, after_s=61)

    assert job_id in expired.failed
    assert "task-of-slow" in expired.revoke
    assert job_id in expired.compensate
    job = _job(runtime, job_id)
    assert job.status == JobStatus.FAILED and job.error is not None
    assert job.error["code"] == JOB_TIMEOUT
    assert job.error["details"]["timeout_s"] == 60
    assert _steps(runtime, job_id) == {
        "extract": StepStatus.SUCCEEDED,
        "slow": StepStatus.CANCELLED,
        "after": StepStatus.CANCELLED,
    }
    with runtime.claims.connect() as conn:
        late = complete_step(
            conn, slow, claim.lease, {"late": True}, utcnow(), profile=claim.profile
        )
    assert not late.written
    with pytest.raises(StopChain):
        run_step(runtime, StepKey(job_id, "after"), task_id=uuid.uuid4().hex)
    with unit_of_work(runtime.sessions) as session:
        kept = session.scalars(
            select(StepRunRow.step_id).where(
                StepRunRow.job_id == job_id, StepRunRow.output.is_not(None)
            )
        ).all()
        undo = session.scalars(
            select(CompensationRow).where(CompensationRow.job_id == job_id)
        ).all()
    assert list(kept) == ["extract"]
    assert [(row.step_id, row.status) for row in undo] == [("extract", CompensationStatus.PENDING)]
    assert job_id not in _expire(runtime, after_s=120).failed


def test_a_job_that_waits_for_a_decision_or_is_queued_fails_at_its_deadline_too(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    queued = submitted(runtime, saga(timeout_s=5), {})
    parked = submitted(runtime, saga(timeout_s=5), {})
    leftovers.extend([queued, parked])
    with unit_of_work(runtime.sessions) as session:
        walk(session, JobRow, JobRow.id == parked, to=JobStatus.AWAITING_APPROVAL)

    expired = _expire(runtime, after_s=6)

    assert {queued, parked} <= set(expired.failed)
    for job_id in (queued, parked):
        assert _job(runtime, job_id).status == JobStatus.FAILED
        assert set(_steps(runtime, job_id).values()) == {StepStatus.CANCELLED}
    assert not {queued, parked} & set(expired.compensate), "nothing had succeeded to undo"


def test_a_job_that_finished_in_time_or_has_no_deadline_is_untouched(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    finished = submitted(runtime, saga(timeout_s=5), {})
    endless = submitted(runtime, saga(timeout_s=None), {})
    leftovers.extend([finished, endless])
    for step_id in ("extract", "slow", "after"):
        run_step(runtime, StepKey(finished, step_id), task_id=uuid.uuid4().hex)
    assert _job(runtime, finished).status == JobStatus.SUCCEEDED
    assert _job(runtime, endless).deadline_at is None

    expired = _expire(runtime, after_s=86400)

    assert not {finished, endless} & set(expired.failed)
    assert _job(runtime, finished).status == JobStatus.SUCCEEDED
    assert _job(runtime, endless).status == JobStatus.QUEUED


def test_the_deadline_is_counted_from_submission_and_the_next_one_is_the_earliest_open(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    job_id = submitted(runtime, saga(timeout_s=3600), {})
    leftovers.append(job_id)
    job = _job(runtime, job_id)
    assert job.deadline_at == job.created_at + timedelta(seconds=3600)
    with unit_of_work(runtime.sessions) as session:
        earliest = next_deadline(session)
    assert earliest is not None and earliest <= job.deadline_at


def test_a_profile_without_timeout_s_keeps_its_stored_form_and_hash() -> None:
    plain = validate_profile(saga(timeout_s=None), source="inline", known_actions=ACTIONS)
    timed = validate_profile(saga(timeout_s=60), source="inline", known_actions=ACTIONS)
    assert "timeout_s" not in plain.to_json()
    assert timed.to_json()["timeout_s"] == 60
    assert plain.content_hash() != timed.content_hash()
    assert "timeout_s" not in ScheduleSpec(every="1h").model_dump(mode="json")


def test_a_schedule_timeout_replaces_the_profile_s_and_a_rerun_keeps_its_parent_s(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    owner = f"o-{uuid.uuid4().hex[:8]}"
    settings = runtime.settings.model_copy(update={"schedule_min_interval_s": 60})
    now = utcnow()
    with unit_of_work(runtime.sessions) as session:
        saved = save_pipeline(
            session,
            owner=owner,
            name=None,
            body=saga(timeout_s=3600),
            settings=settings,
            known_actions=runtime.registry.names(),
        )
        schedule = put_schedule(
            session,
            owner=owner,
            profile=saved.view.profile,
            spec=ScheduleSpec(every="1h", timeout_s=90),
            settings=settings,
            now=now - timedelta(hours=1),
        )
        job, _ = submit_job(
            session,
            JobRequest(pipeline="deadline-saga", params={}),
            owner=owner,
            profiles_dir=runtime.settings.profiles_dir,
            known_actions=runtime.registry.names(),
        )
    leftovers.append(job.id)
    with unit_of_work(runtime.sessions) as session:
        fired = fire_schedule(
            session,
            schedule.id,
            now=now,
            grace_s=90,
            profiles_dir=runtime.settings.profiles_dir,
            known_actions=runtime.registry.names(),
        )
    assert fired.jobs, "the schedule was due"
    scheduled = _job(runtime, fired.jobs[0].id)
    leftovers.append(scheduled.id)

    assert scheduled.deadline_at == scheduled.created_at + timedelta(seconds=90)
    assert job.deadline_at == job.created_at + timedelta(seconds=3600)

    expired = _expire(runtime, after_s=91)
    assert scheduled.id in expired.failed and job.id not in expired.failed
    with unit_of_work(runtime.sessions) as session:
        rerun = rerun_job(session, scheduled.id, RerunRequest(), visible_to=None, now=utcnow())
        leftovers.append(rerun.id)
        assert rerun.deadline_at == rerun.created_at + timedelta(seconds=90)
