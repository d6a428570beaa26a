"""Signals: a step with ``wait_for`` parks ``awaiting_signal`` holding no lease until its signal
is sent, runs at once when it was sent before, and times out as its ``on_timeout`` says; the
signal's payload reaches the steps that read ``signals.<name>``."""

import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from service.engine.checkpoints import step_outputs
from service.engine.jobs import cancel_job
from service.engine.reruns import RerunRequest, rerun_job
from service.engine.runner import run_step
from service.engine.runtime import Runtime
from service.engine.signals import (
    expire_waits,
    next_signal_due,
    park,
    resume_signalled,
    send_signal,
)
from service.engine.steps import StepKey
from service.language.plan import JobPlan
from service.language.snapshots import job_profile
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from service.platform.errors import JobConflict, SignalAlreadyReceived, SignalNotAwaited
from service.platform.models import JobRow, SignalWaitRow, StepRunRow
from service.platform.states import JobStatus, StepStatus
from tests.support.fanouts import submitted


def paid_profile(on_timeout: str = "fail", failure_policy: str = "fail_fast") -> dict[str, Any]:
    return {
        "name": "paid",
        "failure_policy": failure_policy,
        "steps": [
            {"id": "order", "action": "noop", "with": {"n": 1}},
            {
                "id": "charge",
                "action": "noop",
                "depends_on": ["order"],
                "wait_for": {"signal": "payment", "timeout_s": 60, "on_timeout": on_timeout},
                "with": {"amount": "${{ signals.payment.payload.amount }}"},
            },
            {
                "id": "ship",
                "action": "noop",
                "depends_on": ["charge"],
                "with": {"paid_by": "${{ signals.payment.payload.by }}"},
            },
        ],
    }


def _run(rt: Runtime, job_id: uuid.UUID, step_id: str) -> JobPlan:
    plan = run_step(rt, StepKey(job_id, step_id), task_id=uuid.uuid4().hex)
    assert isinstance(plan, JobPlan)
    return plan


def _step(rt: Runtime, job_id: uuid.UUID, step_id: str) -> StepRunRow:
    with unit_of_work(rt.sessions) as session:
        row = session.scalars(
            select(StepRunRow).where(StepRunRow.job_id == job_id, StepRunRow.step_id == step_id)
        ).one()
        session.expunge(row)
        return row


def _job(rt: Runtime, job_id: uuid.UUID) -> JobRow:
    with unit_of_work(rt.sessions) as session:
        job = session.get(JobRow, job_id)
        assert job is not None
        session.expunge(job)
        return job


def _signal(rt: Runtime, job_id: uuid.UUID, name: str, payload: Any) -> list[str]:
    with unit_of_work(rt.sessions) as session:
        sent = send_signal(session, job_id, name, payload, by="bank", visible_to=None, now=utcnow())
        return [step.step_id for step in sent.ready.steps]


def _expire(rt: Runtime, now: datetime) -> list[JobPlan]:
    with unit_of_work(rt.sessions) as session:
        return expire_waits(session, now)


def _outputs(rt: Runtime, job_id: uuid.UUID) -> dict[str, Any]:
    with unit_of_work(rt.sessions) as session:
        return step_outputs(session, job_id, {"order", "charge", "ship"})


def _parked(rt: Runtime) -> uuid.UUID:
    job_id = submitted(rt, paid_profile(), {})
    _run(rt, job_id, "order")
    assert _run(rt, job_id, "charge").steps == []
    return job_id


def test_a_waiting_step_parks_without_its_lease_and_the_job_keeps_running(
    runtime: Runtime,
) -> None:
    job_id = _parked(runtime)

    row = _step(runtime, job_id, "charge")
    assert row.status == StepStatus.AWAITING_SIGNAL
    assert (row.lease_token, row.attempts, row.started_at) == (None, 0, None)
    assert _job(runtime, job_id).status == JobStatus.RUNNING
    assert _run(runtime, job_id, "charge").steps == [], "a second delivery parks nothing twice"


def test_the_signal_sends_the_step_on_and_downstream_reads_its_payload(
    runtime: Runtime,
) -> None:
    job_id = _parked(runtime)

    assert _signal(runtime, job_id, "payment", {"amount": 12, "by": "card"}) == ["charge"]
    assert _step(runtime, job_id, "charge").status == StepStatus.PENDING
    _run(runtime, job_id, "charge")
    _run(runtime, job_id, "ship")

    outputs = _outputs(runtime, job_id)
    assert outputs["charge"] == {"amount": 12}
    assert outputs["ship"] == {"paid_by": "card"}
    assert _job(runtime, job_id).status == JobStatus.SUCCEEDED


def test_a_signal_sent_before_the_step_waits_is_kept_and_consumed(runtime: Runtime) -> None:
    job_id = submitted(runtime, paid_profile(), {})

    assert _signal(runtime, job_id, "payment", {"amount": 3, "by": "cash"}) == []
    _run(runtime, job_id, "order")
    _run(runtime, job_id, "charge")

    assert _step(runtime, job_id, "charge").status == StepStatus.SUCCEEDED
    assert _outputs(runtime, job_id)["charge"] == {"amount": 3}


def test_a_second_signal_and_one_no_step_waits_for_are_refused(runtime: Runtime) -> None:
    job_id = _parked(runtime)
    _signal(runtime, job_id, "payment", {"amount": 1})

    with pytest.raises(SignalAlreadyReceived) as again:
        _signal(runtime, job_id, "payment", {"amount": 2})
    assert again.value.code == "signal_already_received"
    with pytest.raises(SignalNotAwaited) as unknown:
        _signal(runtime, job_id, "refund", {})
    assert unknown.value.code == "signal_not_awaited"


def test_a_cancelled_jobs_parked_step_is_cancelled_and_refuses_signals(runtime: Runtime) -> None:
    job_id = _parked(runtime)
    with unit_of_work(runtime.sessions) as session:
        cancel_job(session, job_id, owner=None, now=utcnow())

    assert _step(runtime, job_id, "charge").status == StepStatus.CANCELLED
    with pytest.raises(JobConflict):
        _signal(runtime, job_id, "payment", {})


def test_no_signal_in_time_fails_the_step_as_signal_timeout(runtime: Runtime) -> None:
    job_id = _parked(runtime)
    with unit_of_work(runtime.sessions) as session:
        wait = session.get(SignalWaitRow, (job_id, "charge"))
        assert wait is not None
        due = wait.due_at
        assert wait.due_at == wait.waiting_since + timedelta(seconds=60)
        earliest = next_signal_due(session)
    assert earliest is not None and earliest <= due

    early = _expire(runtime, due - timedelta(seconds=1))
    assert job_id not in {plan.job_id for plan in early}
    _expire(runtime, due)

    row = _step(runtime, job_id, "charge")
    assert row.status == StepStatus.FAILED
    assert row.error is not None and row.error["code"] == "signal_timeout"
    assert _job(runtime, job_id).status == JobStatus.FAILED
    assert job_id not in {p.job_id for p in _expire(runtime, due)}, "a wait times out once"


def test_a_wait_that_continues_runs_reading_null(runtime: Runtime) -> None:
    job_id = submitted(runtime, paid_profile(on_timeout="continue"), {})
    _run(runtime, job_id, "order")
    _run(runtime, job_id, "charge")

    plans = _expire(runtime, utcnow() + timedelta(seconds=61))
    assert [s.step_id for p in plans if p.job_id == job_id for s in p.steps] == ["charge"]
    _run(runtime, job_id, "charge")
    _run(runtime, job_id, "ship")

    assert _outputs(runtime, job_id)["ship"] == {"paid_by": None}
    assert _job(runtime, job_id).status == JobStatus.SUCCEEDED


def test_a_step_that_parked_as_its_signal_arrived_is_sent_on_by_the_beat(
    runtime: Runtime,
) -> None:
    """The signal's transaction found no parked step and the claim no signal: they crossed."""
    job_id = submitted(runtime, paid_profile(), {})
    _run(runtime, job_id, "order")
    _signal(runtime, job_id, "payment", {"amount": 5})
    with unit_of_work(runtime.sessions) as session:
        row = session.scalars(
            select(StepRunRow).where(StepRunRow.job_id == job_id, StepRunRow.step_id == "charge")
        ).one()
        row.status, row.attempts = StepStatus.RUNNING, 1
        session.flush()
        spec = job_profile(_job(runtime, job_id)).step("charge").wait_for
        assert spec is not None
        park(session, row, spec, utcnow())

    with unit_of_work(runtime.sessions) as session:
        plans = resume_signalled(session)
    assert [s.step_id for p in plans if p.job_id == job_id for s in p.steps] == ["charge"]
    assert _step(runtime, job_id, "charge").status == StepStatus.PENDING


def test_a_rerun_keeps_the_signals_its_reused_steps_waited_for(runtime: Runtime) -> None:
    job_id = _parked(runtime)
    _signal(runtime, job_id, "payment", {"amount": 9, "by": "card"})
    _run(runtime, job_id, "charge")
    _run(runtime, job_id, "ship")
    with unit_of_work(runtime.sessions) as session:
        rerun = rerun_job(
            session, job_id, RerunRequest(from_step="ship"), visible_to=None, now=utcnow()
        ).id

    _run(runtime, rerun, "ship")

    assert _outputs(runtime, rerun)["ship"] == {"paid_by": "card"}
    with pytest.raises(SignalAlreadyReceived):
        _signal(runtime, rerun, "payment", {})


def test_a_when_reads_the_signal_of_its_upstream_wait(runtime: Runtime) -> None:
    profile = paid_profile()
    profile["steps"][2]["when"] = "${{ signals.payment.payload.by }} == 'card'"
    job_id = submitted(runtime, profile, {})
    _signal(runtime, job_id, "payment", {"amount": 1, "by": "cash"})
    _run(runtime, job_id, "order")
    _run(runtime, job_id, "charge")

    _run(runtime, job_id, "ship")

    assert _step(runtime, job_id, "ship").status == StepStatus.SKIPPED
    assert _job(runtime, job_id).status == JobStatus.SUCCEEDED
