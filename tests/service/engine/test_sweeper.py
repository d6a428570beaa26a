"""The sweeper finds work the broker lost and steps stuck past their timeout."""

import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update

from service.engine.claims import claim_step, fast_shard_claims
from service.engine.leases import release_lease
from service.engine.runtime import Runtime
from service.engine.shards import FannedOut, fan_out
from service.engine.steps import Claimed, FanOutDue, StepKey
from service.engine.submission import JobRequest, mark_dispatched, submit_job
from service.engine.sweeper import SweepReport, sweep
from service.language.plan import load_plan
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from service.platform.models import JobRow, StepRunRow
from service.platform.states import JobStatus, StepStatus
from tests.support.arrange import walk
from tests.support.fanouts import fan_profile, submitted

STALL_S = 60.0
GRACE_S = 5.0


def _submit(rt: Runtime, pipeline: str | dict[str, Any] = "slow") -> uuid.UUID:
    with unit_of_work(rt.sessions) as session:
        job, _ = submit_job(
            session,
            JobRequest(pipeline=pipeline, params={}),
            owner="sweeper-test",
            publish_now=False,
            profiles_dir=rt.settings.profiles_dir,
            known_actions=rt.registry.names(),
        )
    return job.id


def _sweep(
    rt: Runtime,
    *,
    after_s: float = 0.0,
    broker_lost: bool = False,
    oldest_waiting: datetime | None = None,
    held: frozenset[uuid.UUID] | None = None,
) -> SweepReport:
    with unit_of_work(rt.sessions) as session:
        return sweep(
            session,
            now=utcnow() + timedelta(seconds=after_s),
            broker_lost=broker_lost,
            stall_after_s=STALL_S,
            dispatch_grace_s=GRACE_S,
            oldest_waiting=None if oldest_waiting is None else {DEFAULT_ROUTE: oldest_waiting},
            held=held,
        )


GPU_ONLY = {
    "name": "gpu-only",
    "queue": "gpu",
    "steps": [{"id": "train", "action": "drill.count", "with": {"name": "train"}}],
}
DEFAULT_ROUTE = ("default", 0)
"""The list of the default queue at the default priority, where these tests' jobs wait."""


def _dispatched(rt: Runtime, job_id: uuid.UUID, after_s: float = 0.0) -> None:
    with unit_of_work(rt.sessions) as session:
        mark_dispatched(session, job_id, utcnow() + timedelta(seconds=after_s))


def test_a_job_never_sent_is_sent_after_the_grace_period(runtime: Runtime) -> None:
    job_id = _submit(runtime)

    assert job_id not in _sweep(runtime).redispatch
    assert job_id in _sweep(runtime, after_s=GRACE_S + 1).redispatch


def test_a_sent_job_with_a_live_step_is_left_alone(runtime: Runtime) -> None:
    job_id = _submit(runtime)
    _dispatched(runtime, job_id)
    with unit_of_work(runtime.sessions) as session:
        claim_step(session, StepKey(job_id, "before"), task_id="t", lease_s=600, now=utcnow())

    assert job_id not in _sweep(runtime, after_s=STALL_S + 1).redispatch


def test_an_expired_lease_gets_its_job_sent_again(runtime: Runtime) -> None:
    job_id = _submit(runtime)
    _dispatched(runtime, job_id)
    with unit_of_work(runtime.sessions) as session:
        claim_step(session, StepKey(job_id, "before"), task_id="t", lease_s=2, now=utcnow())

    assert job_id in _sweep(runtime, after_s=3).redispatch


def test_a_released_lease_gets_its_job_sent_again_without_waiting_for_it_to_lapse(
    runtime: Runtime,
) -> None:
    job_id = _submit(runtime)
    _dispatched(runtime, job_id)
    key = StepKey(job_id, "before")
    with unit_of_work(runtime.sessions) as session:
        claim = claim_step(session, key, task_id="t", lease_s=600, now=utcnow())
    assert isinstance(claim, Claimed)
    with runtime.claims.connect() as conn:
        release_lease(conn, key, claim.lease, utcnow())

    assert job_id in _sweep(runtime).redispatch


def test_a_job_sent_again_after_its_lease_lapsed_is_left_to_that_message_while_it_may_be_queued(
    runtime: Runtime,
) -> None:
    """Behind a backlog longer than the grace, sending every pass would feed the backlog."""
    job_id = _submit(runtime)
    with unit_of_work(runtime.sessions) as session:
        claim_step(session, StepKey(job_id, "before"), task_id="t", lease_s=2, now=utcnow())
    _dispatched(runtime, job_id, after_s=3)
    queued_since = utcnow() + timedelta(seconds=2.5)

    assert job_id not in _sweep(runtime, after_s=4).redispatch
    assert job_id in _sweep(runtime, after_s=3 + GRACE_S + 1).redispatch
    assert job_id not in _sweep(runtime, after_s=300, oldest_waiting=queued_since).redispatch
    assert (
        job_id
        in _sweep(runtime, after_s=300, oldest_waiting=utcnow() + timedelta(seconds=4)).redispatch
    )


def test_a_stalled_job_is_sent_again(runtime: Runtime) -> None:
    job_id = _submit(runtime)
    _dispatched(runtime, job_id)

    assert job_id not in _sweep(runtime, after_s=1).redispatch
    assert job_id in _sweep(runtime, after_s=STALL_S + 1).redispatch


def test_a_job_sent_after_the_oldest_waiting_message_may_still_be_queued_so_is_not_stalled(
    runtime: Runtime,
) -> None:
    sent_before = utcnow()
    job_id = _submit(runtime)
    _dispatched(runtime, job_id)
    later = STALL_S * 10

    assert job_id not in _sweep(runtime, after_s=later, oldest_waiting=sent_before).redispatch
    its_own = utcnow()
    assert job_id not in _sweep(runtime, after_s=later, oldest_waiting=its_own).redispatch
    sent_after = utcnow() + timedelta(seconds=GRACE_S + 1)
    assert job_id in _sweep(runtime, after_s=later, oldest_waiting=sent_after).redispatch
    assert job_id in _sweep(runtime, after_s=later, oldest_waiting=None).redispatch


def test_a_job_waiting_in_a_queue_no_worker_consumes_is_neither_stalled_nor_lost(
    runtime: Runtime,
) -> None:
    """Its list's oldest message is its own, however old; the default queue's newer backlog
    says nothing about it."""
    job_id = _submit(runtime, GPU_ONLY)
    _dispatched(runtime, job_id)
    waiting = {("gpu", 0): utcnow(), ("default", 0): utcnow() + timedelta(seconds=STALL_S * 9)}
    with unit_of_work(runtime.sessions) as session:
        report = sweep(
            session,
            now=utcnow() + timedelta(seconds=STALL_S * 10),
            broker_lost=False,
            stall_after_s=STALL_S,
            dispatch_grace_s=GRACE_S,
            oldest_waiting=waiting,
            held=frozenset(),
        )
    assert job_id not in report.redispatch


def test_a_job_in_no_queue_and_held_by_no_worker_is_sent_again_after_the_grace(
    runtime: Runtime,
) -> None:
    """Its message was lost in flight: the stall sweep's wait is not needed to know it."""
    job_id = _submit(runtime)
    _dispatched(runtime, job_id)
    nowhere: frozenset[uuid.UUID] = frozenset()

    assert job_id not in _sweep(runtime, after_s=1, held=nowhere).redispatch
    found = _sweep(runtime, after_s=GRACE_S + 1, held=nowhere)
    assert found.causes.get(job_id) == "lost_in_flight"
    assert job_id not in _sweep(runtime, after_s=GRACE_S + 1).redispatch, "held not read"


def test_a_fan_out_whose_lanes_were_never_sent_is_sent_again_not_waited_on(
    runtime: Runtime,
) -> None:
    """A worker died between the fan-out's commit and the publish of its lanes. The step's
    message, delivered again, runs nothing and is acknowledged instead of waiting for a lease
    that nobody holds, so the job is held by no worker and the sweeper sends the lanes."""
    key = StepKey(submitted(runtime, fan_profile(), {"items": [1, 2, 3]}), "each")
    _dispatched(runtime, key.job_id)
    with unit_of_work(runtime.sessions) as session:
        due = claim_step(session, key, task_id="first", lease_s=30, now=utcnow())
        assert isinstance(due, FanOutDue)
        fanned = fan_out(session, due, utcnow(), max_items=10, max_job_steps=100)
        assert isinstance(fanned, FannedOut)

    with unit_of_work(runtime.sessions) as session:
        again = claim_step(session, key, task_id="again", lease_s=30, now=utcnow())

    assert again is None
    found = _sweep(runtime, after_s=GRACE_S + 1, held=frozenset())
    assert found.causes.get(key.job_id) == "lost_in_flight"
    with unit_of_work(runtime.sessions) as session:
        plan = load_plan(session, key.job_id)
    assert plan is not None
    assert [(step.step_id, step.shards) for step in plan.steps] == [("each", [0, 1, 2])]


def test_a_job_a_worker_holds_or_that_may_be_queued_is_not_lost_in_flight(
    runtime: Runtime,
) -> None:
    sent_before = utcnow()
    job_id = _submit(runtime)
    _dispatched(runtime, job_id)
    later = GRACE_S + 1

    assert job_id not in _sweep(runtime, after_s=later, held=frozenset({job_id})).redispatch
    queued = _sweep(runtime, after_s=later, oldest_waiting=sent_before, held=frozenset())
    assert job_id not in queued.redispatch


def test_a_job_waiting_for_a_decision_is_not_lost_in_flight(runtime: Runtime) -> None:
    job_id = _submit(runtime)
    _dispatched(runtime, job_id)
    with unit_of_work(runtime.sessions) as session:
        walk(session, JobRow, JobRow.id == job_id, to=JobStatus.AWAITING_APPROVAL)

    assert job_id not in _sweep(runtime, after_s=GRACE_S + 1, held=frozenset()).redispatch


def test_a_job_waiting_for_a_signal_is_not_stalled_unless_another_step_of_it_is(
    runtime: Runtime,
) -> None:
    job_id = _submit(
        runtime,
        {
            "name": "signalled",
            "steps": [
                {"id": "wait", "action": "noop", "wait_for": {"signal": "go"}},
                {"id": "other", "action": "noop"},
            ],
        },
    )
    _dispatched(runtime, job_id)
    with unit_of_work(runtime.sessions) as session:
        key = StepKey(job_id, "wait")
        assert claim_step(session, key, task_id="t", lease_s=30, now=utcnow()) is None

    assert job_id in _sweep(runtime, after_s=STALL_S + 1).redispatch, "other's message is lost"
    with unit_of_work(runtime.sessions) as session:
        walk(
            session,
            StepRunRow,
            StepRunRow.job_id == job_id,
            StepRunRow.step_id == "other",
            to=StepStatus.SUCCEEDED,
        )
    assert job_id not in _sweep(runtime, after_s=STALL_S + 1).redispatch


def test_a_reset_broker_gets_every_open_job_sent_again(runtime: Runtime) -> None:
    job_id = _submit(runtime)
    _dispatched(runtime, job_id)

    assert job_id in _sweep(runtime, broker_lost=True).redispatch


def test_a_step_past_its_timeout_is_failed_even_while_its_lease_is_renewed(
    runtime: Runtime,
) -> None:
    job_id = _submit(runtime, "timeout")
    _dispatched(runtime, job_id)
    key = StepKey(job_id, "stuck")
    with unit_of_work(runtime.sessions) as session:
        claim = claim_step(session, key, task_id="t", lease_s=600, now=utcnow())
        assert isinstance(claim, Claimed)
        session.execute(
            update(StepRunRow)
            .where(StepRunRow.job_id == job_id, StepRunRow.step_id == "stuck")
            .values(started_at=utcnow() - timedelta(seconds=60))
        )

    report = _sweep(runtime)

    assert report.timed_out >= 1
    with unit_of_work(runtime.sessions) as session:
        job = session.get(JobRow, job_id)
        assert job is not None and job.status == "failed"
        assert job.error is not None and job.error["code"] == "timeout"


def test_a_fan_out_waiting_for_its_items_longer_than_its_timeout_is_not_failed_but_an_item_is(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    """The step's timeout holds each item's attempt, not the wait for all of them."""
    profile = fan_profile()
    profile["steps"][0]["timeout_s"] = 5
    job_id = submitted(runtime, profile, {"items": [1, 2, 3]})
    leftovers.append(job_id)
    _dispatched(runtime, job_id)
    long_ago = utcnow() - timedelta(seconds=60)
    with unit_of_work(runtime.sessions) as session:
        due = claim_step(session, StepKey(job_id, "each"), task_id="t", lease_s=600, now=long_ago)
        assert isinstance(due, FanOutDue)
        assert isinstance(
            fan_out(session, due, long_ago, max_items=10, max_job_steps=100), FannedOut
        )
    with runtime.claims.connect() as conn:
        (lane,) = fast_shard_claims(
            conn, StepKey(job_id, "each"), take=1, task_id="t0", lease_s=600, now=long_ago
        )
        assert lane.key.shard == 0

    def errors() -> dict[int, str | None]:
        with unit_of_work(runtime.sessions) as session:
            rows = session.scalars(select(StepRunRow).where(StepRunRow.job_id == job_id))
            return {row.shard: (row.error or {}).get("code") for row in rows}

    _sweep(runtime)

    assert errors() == {-1: None, 0: "timeout", 1: None, 2: None}


def test_a_job_whose_step_waits_for_its_rate_limit_is_not_stalled(runtime: Runtime) -> None:
    job_id = _submit(runtime)
    _dispatched(runtime, job_id)
    with unit_of_work(runtime.sessions) as session:
        walk(session, StepRunRow, StepRunRow.job_id == job_id, to=StepStatus.AWAITING_RATE)

    assert job_id not in _sweep(runtime, after_s=STALL_S + 1).redispatch
