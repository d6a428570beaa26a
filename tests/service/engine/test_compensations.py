"""Sagas in PostgreSQL: what a job that fails fast or is cancelled records to undo, and how
its compensations are claimed, one at a time, latest completion first, each recorded once."""

import os
import uuid
from datetime import timedelta
from typing import Any

import pytest
import redis
from sqlalchemy import select

from service.engine.claims import claim_step
from service.engine.compensations import (
    CompensationClaim,
    Due,
    claim_next,
    compensation_of,
    lost,
    record_outcome,
)
from service.engine.filters import JobFilter
from service.engine.jobs import cancel_job, list_jobs
from service.engine.runner import run_step
from service.engine.runtime import Runtime
from service.engine.saga import run_compensation
from service.engine.steps import StepKey
from service.engine.submission import mark_dispatched
from service.engine.sweeper import sweep
from service.language.plan import JobPlan
from service.language.snapshots import job_profile
from service.platform.clock import utcnow
from service.platform.constants import WAIT_FOR_PEER_MAX_S
from service.platform.db import unit_of_work
from service.platform.errors import RetryLater
from service.platform.models import CompensationRow, JobRow
from tests.support.arrange import walk
from tests.support.fanouts import submitted

LEASE_S = 30.0


def saga(
    *,
    load: dict[str, Any] | None = None,
    undo_transform: dict[str, Any] | None = None,
    **profile: Any,
) -> dict[str, Any]:
    """extract -> transform -> load; the first two undo themselves with drill.undo, and the
    undo of extract reads what extract returned."""
    return {
        "name": "saga",
        "steps": [
            {
                "id": "extract",
                "action": "noop",
                "with": {"hold_s": 0},
                "compensate": {
                    "action": "drill.undo",
                    "with": {
                        "name": "undo-extract",
                        "hold_s": "${{ steps.extract.output.hold_s }}",
                    },
                    "timeout_s": 40,
                },
            },
            {
                "id": "transform",
                "action": "noop",
                "depends_on": ["extract"],
                "compensate": undo_transform
                or {"action": "drill.undo", "with": {"name": "undo-transform"}, "timeout_s": 20},
            },
            {
                "id": "load",
                "action": "fail",
                "depends_on": ["transform"],
                "with": {"message": "the warehouse refused the batch", "retryable": False},
                **(load or {}),
            },
        ],
        **profile,
    }


def _run(rt: Runtime, job_id: uuid.UUID, *steps: str) -> Any:
    plan: Any = None
    for step_id in steps:
        plan = run_step(rt, StepKey(job_id, step_id), task_id=uuid.uuid4().hex)
    return plan


def _failed_saga(rt: Runtime, **changes: Any) -> uuid.UUID:
    job_id = submitted(rt, saga(**changes), {})
    _run(rt, job_id, "extract", "transform", "load")
    return job_id


def _rows(rt: Runtime, job_id: uuid.UUID) -> list[CompensationRow]:
    with unit_of_work(rt.sessions) as session:
        return list(
            session.scalars(
                select(CompensationRow)
                .where(CompensationRow.job_id == job_id)
                .order_by(CompensationRow.seq)
            )
        )


def _claim(rt: Runtime, job_id: uuid.UUID, step_id: str, after_s: float = 0.0) -> Any:
    with unit_of_work(rt.sessions) as session:
        job = session.get(JobRow, job_id)
        assert job is not None
        now = utcnow() + timedelta(seconds=after_s)
        return claim_next(session, job, job_profile(job), step_id, LEASE_S, now)


def _counters() -> redis.Redis:
    """Redis DB 0, where the drill actions count their runs."""
    url = os.environ["FLOWBEAT_BROKER_URL"].rsplit("/", 1)[0] + "/0"
    return redis.Redis.from_url(url, decode_responses=True)


def _undone(job_id: uuid.UUID) -> list[str]:
    return [str(name) for name in _counters().lrange(f"drill:{job_id}:undo-order", 0, -1)]


def test_failing_fast_records_what_succeeded_latest_completion_first(runtime: Runtime) -> None:
    job_id = submitted(runtime, saga(), {})
    plan = _run(runtime, job_id, "extract", "transform", "load")

    assert plan == JobPlan(job_id, compensate=True)
    rows = _rows(runtime, job_id)
    assert [(row.step_id, row.seq, row.status) for row in rows] == [
        ("transform", 0, "pending"),
        ("extract", 1, "pending"),
    ]


def test_a_best_effort_job_that_fails_records_nothing_to_undo(runtime: Runtime) -> None:
    job_id = _failed_saga(runtime, failure_policy="best_effort")

    with unit_of_work(runtime.sessions) as session:
        job = session.get(JobRow, job_id)
        assert job is not None and job.status == "failed"
    assert _rows(runtime, job_id) == []


def test_an_unnamed_message_only_names_the_next_compensation_and_its_timeout(
    runtime: Runtime,
) -> None:
    job_id = _failed_saga(runtime)

    assert run_compensation(runtime, job_id, None) == Due("transform", 20)
    assert run_compensation(runtime, job_id, "extract") == Due("transform", 20)
    assert [row.attempts for row in _rows(runtime, job_id)] == [0, 0]


def test_compensations_run_one_at_a_time_latest_first_with_a_stable_idempotency_key(
    runtime: Runtime,
) -> None:
    job_id = _failed_saga(runtime)

    assert run_compensation(runtime, job_id, "transform") == Due("extract", 40)
    assert run_compensation(runtime, job_id, "extract") is None

    assert [(row.status, row.attempts) for row in _rows(runtime, job_id)] == [
        ("compensated", 1),
        ("compensated", 1),
    ]
    assert _undone(job_id) == ["undo-transform", "undo-extract"]
    key = _counters().get(f"drill:{job_id}:undo-extract:key")
    assert key == f"{job_id}:extract:compensate"


def test_a_compensation_held_by_a_live_lease_sends_its_message_back_until_it_could_lapse(
    runtime: Runtime,
) -> None:
    job_id = _failed_saga(runtime)
    assert isinstance(_claim(runtime, job_id, "transform"), CompensationClaim)

    for step_id in ("transform", "extract", None):
        with pytest.raises(RetryLater) as later:
            run_compensation(runtime, job_id, step_id)
        assert 0 < later.value.delay_s <= WAIT_FOR_PEER_MAX_S
    assert _undone(job_id) == []


def test_a_lapsed_lease_is_taken_over_and_only_the_new_holder_records_the_outcome(
    runtime: Runtime,
) -> None:
    job_id = _failed_saga(runtime)
    killed = _claim(runtime, job_id, "transform")
    taken_over = _claim(runtime, job_id, "transform", after_s=LEASE_S + 1)
    assert isinstance(taken_over, CompensationClaim) and taken_over.attempt == 2

    with unit_of_work(runtime.sessions) as session:
        record_outcome(session, killed, None, None, utcnow())
    assert _rows(runtime, job_id)[0].status == "running"
    with unit_of_work(runtime.sessions) as session:
        record_outcome(session, taken_over, None, None, utcnow())

    first = _rows(runtime, job_id)[0]
    assert (first.status, first.attempts, first.lease_token) == ("compensated", 2, None)


def test_a_compensation_is_retried_by_its_own_policy_then_failed_for_good_and_the_next_runs(
    runtime: Runtime,
) -> None:
    undo = {
        "action": "fail",
        "with": {"message": "the staging table is locked"},
        "retry": {"attempts": 2, "backoff_s": 0},
    }
    job_id = _failed_saga(runtime, undo_transform=undo)

    with pytest.raises(RetryLater):
        run_compensation(runtime, job_id, "transform")
    assert (_rows(runtime, job_id)[0].status, _rows(runtime, job_id)[0].attempts) == (
        "pending",
        1,
    )
    assert run_compensation(runtime, job_id, "transform") == Due("extract", 40)
    assert run_compensation(runtime, job_id, "extract") is None

    transform, extract = _rows(runtime, job_id)
    assert (transform.status, transform.attempts) == ("compensation_failed", 2)
    assert transform.error is not None
    assert transform.error["message"] == "the staging table is locked"
    assert extract.status == "compensated"


def test_inputs_that_do_not_resolve_fail_the_compensation_for_good_without_running_it(
    runtime: Runtime,
) -> None:
    undo = {"action": "drill.undo", "with": {"name": "${{ steps.transform.output.absent }}"}}
    job_id = _failed_saga(runtime, undo_transform=undo)

    assert run_compensation(runtime, job_id, "transform") == Due("extract", 40)

    transform = _rows(runtime, job_id)[0]
    assert transform.status == "compensation_failed" and transform.attempts == 0
    assert transform.error is not None and transform.error["code"] == "bad_reference"


def test_the_job_shows_its_compensation_and_a_failed_one_is_listed_for_an_operator(
    runtime: Runtime,
) -> None:
    undo = {"action": "fail", "with": {"retryable": False}}
    job_id = _failed_saga(runtime, undo_transform=undo)

    def shown() -> Any:
        with unit_of_work(runtime.sessions) as session:
            return compensation_of(session, job_id)

    def flagged() -> bool:
        with unit_of_work(runtime.sessions) as session:
            job = session.get(JobRow, job_id)
            assert job is not None
            jobs, _ = list_jobs(
                session,
                owner=job.owner,
                match=JobFilter(statuses=("failed",), compensation_failed=True),
                limit=10,
            )
        return job_id in [job.id for job in jobs]

    assert shown()["status"] == "running" and not flagged()
    run_compensation(runtime, job_id, "transform")
    run_compensation(runtime, job_id, "extract")

    assert shown() == {
        "status": "failed",
        "steps": [
            {
                "step_id": "transform",
                "status": "compensation_failed",
                "attempts": 1,
                "error": {
                    "code": "action_failed",
                    "message": "failed",
                    "details": {"attempt": 1},
                },
            },
            {"step_id": "extract", "status": "compensated", "attempts": 1, "error": None},
        ],
    }
    assert flagged()


@pytest.mark.parametrize(("on_cancel", "undone"), [("compensate", ["extract"]), ("leave", [])])
def test_cancelling_records_the_compensations_unless_the_profile_says_leave(
    runtime: Runtime, on_cancel: str, undone: list[str]
) -> None:
    job_id = submitted(runtime, saga(on_cancel=on_cancel), {})
    _run(runtime, job_id, "extract")

    with unit_of_work(runtime.sessions) as session:
        cancel_job(session, job_id, owner=None, now=utcnow())

    assert [row.step_id for row in _rows(runtime, job_id)] == undone


def test_the_sweeper_sends_the_compensations_of_a_job_its_timed_out_step_failed(
    runtime: Runtime,
) -> None:
    job_id = submitted(runtime, saga(load={"action": "sleep", "with": {"seconds": 60}}), {})
    _run(runtime, job_id, "extract", "transform")
    with unit_of_work(runtime.sessions) as session:
        claim_step(session, StepKey(job_id, "load"), task_id="t", lease_s=600, now=utcnow())

    with unit_of_work(runtime.sessions) as session:
        report = sweep(
            session,
            now=utcnow() + timedelta(seconds=400),
            broker_lost=False,
            stall_after_s=600,
            dispatch_grace_s=5,
        )

    assert job_id in report.compensate
    assert [row.step_id for row in _rows(runtime, job_id)] == ["transform", "extract"]


def test_the_sweeper_finds_compensations_no_message_is_running(runtime: Runtime) -> None:
    waiting = _failed_saga(runtime)
    abandoned = _failed_saga(runtime)
    _claim(runtime, abandoned, "transform")

    def found(after_s: float) -> set[uuid.UUID]:
        now = utcnow() + timedelta(seconds=after_s)
        with unit_of_work(runtime.sessions) as session:
            return lost(session, now, sent_before=now - timedelta(seconds=5))

    assert not {waiting, abandoned} & found(0)
    assert waiting in found(6) and abandoned not in found(6)
    assert {waiting, abandoned} <= found(LEASE_S + 1)
    with unit_of_work(runtime.sessions) as session:
        walk(session, CompensationRow, CompensationRow.job_id == waiting, to="compensated")
    assert waiting not in found(LEASE_S + 1)


def test_a_compensation_sent_again_is_left_to_its_message_while_that_may_still_be_queued(
    runtime: Runtime,
) -> None:
    """Behind a backlog longer than the grace, sending every pass would feed the backlog."""
    waiting = _failed_saga(runtime)
    abandoned = _failed_saga(runtime)
    _claim(runtime, abandoned, "transform")
    resent_at = utcnow() + timedelta(seconds=LEASE_S + 10)
    with unit_of_work(runtime.sessions) as session:
        for job_id in (waiting, abandoned):
            mark_dispatched(session, job_id, resent_at)

    def found(after_s: float, oldest_queued_s: float | None = None) -> set[uuid.UUID]:
        now = resent_at + timedelta(seconds=after_s)
        queued = None if oldest_queued_s is None else resent_at + timedelta(seconds=oldest_queued_s)
        with unit_of_work(runtime.sessions) as session:
            return sweep(
                session,
                now=now,
                broker_lost=False,
                stall_after_s=600,
                dispatch_grace_s=5,
                oldest_waiting=None if queued is None else {("default", 0): queued},
            ).compensate

    assert not {waiting, abandoned} & found(1)
    assert {waiting, abandoned} <= found(6)
    assert not {waiting, abandoned} & found(300, oldest_queued_s=-1)
    assert {waiting, abandoned} <= found(300, oldest_queued_s=1)


def test_a_compensation_of_a_triggered_job_reads_the_trigger(runtime: Runtime) -> None:
    upstream = uuid.uuid4()
    undo = {"action": "drill.undo", "with": {"name": "${{ trigger.job_id }}"}}
    job_id = submitted(runtime, saga(undo_transform=undo, on={"succeeded": ["upstream"]}), {})
    with unit_of_work(runtime.sessions) as session:
        job = session.get(JobRow, job_id)
        assert job is not None
        job.trigger_data = {"job_id": str(upstream), "result": None, "new_items": []}
    _run(runtime, job_id, "extract", "transform", "load")

    assert run_compensation(runtime, job_id, "transform") == Due("extract", 40)

    transform = _rows(runtime, job_id)[0]
    assert transform.status == "compensated", transform.error
    assert _undone(job_id) == [str(upstream)]
