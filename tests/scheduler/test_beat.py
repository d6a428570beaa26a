"""The beat leader's deadline check: a job past its deadline is failed and committed before its
tasks are revoked and its compensations sent; a job whose deadline is ahead is left alone. Its
signal timeouts likewise send a step on only once its move is committed.

It calls the tick's deadline part rather than the whole tick, which would also fire the
schedules other tests of this process left in the shared database."""

import uuid
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import select

from service.engine.claims import fast_claim
from service.engine.jobs import cancel_job
from service.engine.runner import run_step
from service.engine.steps import StepKey
from service.language.plan import JobPlan
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from service.platform.models import JobRow, StepRunRow
from service.platform.states import JobStatus
from tests.conftest import Stack
from tests.service.engine.test_deadlines import saga
from tests.service.engine.test_signals import paid_profile
from tests.support.fanouts import submitted

if TYPE_CHECKING:
    from scheduler.beat import FlowbeatScheduler


@pytest.fixture
def beat(stack: Stack) -> Iterator["FlowbeatScheduler"]:
    from scheduler.beat import FlowbeatScheduler  # builds the Celery app: only once stack is up
    from tasks.app import app

    scheduler = FlowbeatScheduler(app=app, lazy=True)
    yield scheduler
    scheduler.close()


def test_the_leader_fails_a_job_past_its_deadline_then_revokes_and_compensates_it(
    beat: "FlowbeatScheduler",
) -> None:
    rt = beat.runtime
    job_id = submitted(rt, saga(timeout_s=2), {})
    run_step(rt, StepKey(job_id, "extract"), task_id=uuid.uuid4().hex)
    with rt.claims.connect() as conn:
        assert fast_claim(conn, StepKey(job_id, "slow"), task_id="t-slow", lease_s=60, now=utcnow())
    seen: dict[str, Any] = {}

    def status() -> str:
        with unit_of_work(rt.sessions) as session:
            job = session.get(JobRow, job_id)
            assert job is not None
            return job.status

    def revoke(task_ids: Iterable[str]) -> None:
        if "t-slow" in task_ids:
            seen["status at revoke"] = status()

    def compensate(job_ids: Iterable[uuid.UUID]) -> None:
        seen.setdefault("compensate", []).extend(job_ids)

    beat.revoke = revoke  # type: ignore[method-assign]
    beat.compensate = compensate  # type: ignore[method-assign]
    ahead = submitted(rt, saga(timeout_s=5), {})

    beat.expire_deadlines(utcnow() + timedelta(seconds=3))

    assert status() == JobStatus.FAILED
    assert seen["status at revoke"] == JobStatus.FAILED
    assert job_id in seen["compensate"]
    with unit_of_work(rt.sessions) as session:
        job = session.get(JobRow, ahead)
        assert job is not None and job.status == JobStatus.QUEUED
        cancel_job(session, ahead, owner=None, now=utcnow())


def test_the_leader_fails_every_job_past_its_deadline_a_batch_at_a_time(
    beat: "FlowbeatScheduler", monkeypatch: pytest.MonkeyPatch
) -> None:
    import scheduler.beat
    from service.engine import deadlines

    monkeypatch.setattr(deadlines, "EXPIRE_BATCH", 2)
    monkeypatch.setattr(scheduler.beat, "EXPIRE_BATCH", 2)
    job_ids = [submitted(beat.runtime, saga(timeout_s=1), {}) for _ in range(5)]

    beat.expire_deadlines(utcnow() + timedelta(seconds=2))

    with unit_of_work(beat.runtime.sessions) as session:
        for job_id in job_ids:
            job = session.get(JobRow, job_id)
            assert job is not None and job.status == JobStatus.FAILED


def test_the_leader_sends_a_timed_out_signal_wait_on_after_its_commit(
    beat: "FlowbeatScheduler", monkeypatch: pytest.MonkeyPatch
) -> None:
    import scheduler.beat

    rt = beat.runtime
    job_id = submitted(rt, paid_profile(on_timeout="continue"), {})
    run_step(rt, StepKey(job_id, "order"), task_id=uuid.uuid4().hex)
    run_step(rt, StepKey(job_id, "charge"), task_id=uuid.uuid4().hex)
    sent: dict[str, str | None] = {}

    def publish(app: Any, runtime: Any, plan: JobPlan) -> bool:
        if plan.job_id == job_id:
            with unit_of_work(rt.sessions) as session:
                for step in plan.steps:
                    sent[step.step_id] = session.scalar(
                        select(StepRunRow.status).where(
                            StepRunRow.job_id == job_id, StepRunRow.step_id == step.step_id
                        )
                    )
        return True

    monkeypatch.setattr(scheduler.beat, "publish_or_defer", publish)

    beat.expire_signal_waits(utcnow() + timedelta(seconds=61))

    assert sent == {"charge": "pending"}, "sent once its move back to pending is committed"
