"""Step state in PostgreSQL: leases fence out stale workers, checkpoints are written once."""

import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from sqlalchemy import func, select

from service.engine.checkpoints import complete_step
from service.engine.claims import claim_step, fast_claim, taken_by
from service.engine.completion import fail_step
from service.engine.jobs import cancel_job
from service.engine.leases import release_lease, renew_lease
from service.engine.runtime import Runtime
from service.engine.steps import Claimed, Follow, Lease, StepKey
from service.engine.submission import JobRequest, submit_job
from service.language.loading import find_profile
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from service.platform.errors import RetryLater, StopChain
from service.platform.models import JobRow, StepRunRow

LEASE_S = 30.0


def _submit(rt: Runtime, pipeline: str = "slow") -> uuid.UUID:
    with unit_of_work(rt.sessions) as session:
        job, _ = submit_job(
            session,
            JobRequest(pipeline=pipeline, params={}),
            owner="steps-test",
            profiles_dir=rt.settings.profiles_dir,
            known_actions=rt.registry.names(),
        )
    return job.id


def _claim(rt: Runtime, key: StepKey, now_offset_s: float = 0.0) -> Claimed:
    with unit_of_work(rt.sessions) as session:
        now = utcnow() + timedelta(seconds=now_offset_s)
        claim = claim_step(session, key, task_id=uuid.uuid4().hex, lease_s=LEASE_S, now=now)
    assert isinstance(claim, Claimed)
    return claim


def _complete(
    rt: Runtime, conn: psycopg.Connection[Any], key: StepKey, lease: Lease, output: Any
) -> bool:
    profile = find_profile(rt.settings.profiles_dir, "slow")
    return complete_step(conn, key, lease, output, utcnow(), profile=profile).written


def _row(rt: Runtime, key: StepKey) -> StepRunRow:
    with unit_of_work(rt.sessions) as session:
        return session.scalars(
            select(StepRunRow).where(
                StepRunRow.job_id == key.job_id, StepRunRow.step_id == key.step_id
            )
        ).one()


def test_a_claimed_step_resolves_its_inputs_and_takes_a_lease(runtime: Runtime) -> None:
    job_id = _submit(runtime)
    claim = _claim(runtime, StepKey(job_id, "before"))

    assert claim.inputs == {"name": "before"}
    assert claim.lease.attempt == 1
    row = _row(runtime, claim.key)
    assert row.status == "running" and row.lease_token == claim.lease.token


def test_the_fast_claim_takes_a_ready_step_in_one_statement(runtime: Runtime) -> None:
    key = StepKey(_submit(runtime), "before")
    with runtime.claims.connect() as conn:
        first = fast_claim(conn, key, task_id="t1", lease_s=LEASE_S, now=utcnow())
        second = fast_claim(conn, key, task_id="t2", lease_s=LEASE_S, now=utcnow())
        blocked = fast_claim(
            conn, StepKey(key.job_id, "slow"), task_id="t3", lease_s=LEASE_S, now=utcnow()
        )

    assert first is not None and first.lease.attempt == 1
    assert second is None and blocked is None
    with unit_of_work(runtime.sessions) as session:
        job = session.get(JobRow, key.job_id)
        assert job is not None and job.status == "running" and job.started_at is not None


def _outputs_handed_to_after(rt: Runtime, key: StepKey, before: Any, slow: Any) -> Any:
    """Run ``before`` and ``slow`` of ``key``'s job to their checkpoints with these outputs,
    then fast-claim ``after`` and return the outputs its claim hands over."""
    claim = _claim(rt, key)
    with rt.checkpoints.connect() as conn:
        assert _complete(rt, conn, key, claim.lease, before)
        taken = fast_claim(
            conn, StepKey(key.job_id, "slow"), task_id="t", lease_s=LEASE_S, now=utcnow()
        )
        assert taken is not None
        assert _complete(rt, conn, StepKey(key.job_id, "slow"), taken.lease, slow)
        after = fast_claim(
            conn, StepKey(key.job_id, "after"), task_id="t", lease_s=LEASE_S, now=utcnow()
        )
    assert after is not None
    return after.outputs


def test_the_fast_claim_hands_over_the_outputs_a_step_references(runtime: Runtime) -> None:
    key = StepKey(_submit(runtime), "before")

    outputs = _outputs_handed_to_after(runtime, key, {"name": "up"}, {"name": "slow"})

    assert outputs == {"slow": {"name": "slow"}}


def test_an_output_of_none_is_a_checkpoint_that_the_child_reads_as_none(
    runtime: Runtime,
) -> None:
    key = StepKey(_submit(runtime), "before")

    assert _outputs_handed_to_after(runtime, key, None, None) == {"slow": None}
    with unit_of_work(runtime.sessions) as session:
        checkpointed = session.scalars(
            select(StepRunRow.step_id).where(
                StepRunRow.job_id == key.job_id, StepRunRow.output.is_not(None)
            )
        ).all()
    assert sorted(checkpointed) == ["before", "slow"]


def test_a_checkpoint_claims_the_child_it_alone_precedes_for_the_same_message(
    runtime: Runtime,
) -> None:
    key = StepKey(_submit(runtime), "before")
    claim = _claim(runtime, key)
    profile = find_profile(runtime.settings.profiles_dir, "slow")
    with runtime.checkpoints.connect() as conn:
        done = complete_step(
            conn,
            key,
            claim.lease,
            {"name": "up"},
            utcnow(),
            profile=profile,
            follow=Follow("slow", "message-1", LEASE_S),
        )
        assert done.taken is not None
        slow = done.taken
        after = complete_step(
            conn,
            slow.key,
            slow.lease,
            {"name": "slow"},
            utcnow(),
            profile=profile,
            follow=Follow("after", "message-1", LEASE_S),
        )

    assert done.written and done.ready.steps == []
    assert slow.key == StepKey(key.job_id, "slow") and slow.lease.attempt == 1
    assert slow.outputs == {}
    assert after.taken is not None and after.taken.outputs == {"slow": {"name": "slow"}}
    row = _row(runtime, after.taken.key)
    assert (row.status, row.task_id, row.waiting_on) == ("running", "message-1", 0)
    assert row.lease_token == after.taken.lease.token
    with runtime.claims.connect() as conn:
        assert taken_by(conn, key.job_id, "message-1") == "after"
        assert taken_by(conn, key.job_id, "message-2") is None


def test_a_checkpoint_under_a_lost_lease_claims_no_child(runtime: Runtime) -> None:
    key = StepKey(_submit(runtime), "before")
    claim = _claim(runtime, key)
    profile = find_profile(runtime.settings.profiles_dir, "slow")
    stale = Lease("not-the-holder", claim.lease.attempt)
    with runtime.checkpoints.connect() as conn:
        done = complete_step(
            conn,
            key,
            stale,
            {"name": "up"},
            utcnow(),
            profile=profile,
            follow=Follow("slow", "message-1", LEASE_S),
        )

    assert not done.written and done.taken is None
    row = _row(runtime, StepKey(key.job_id, "slow"))
    assert (row.status, row.waiting_on, row.task_id) == ("pending", 1, None)


def test_a_step_sent_before_its_upstream_settled_is_left_to_its_last_parent(
    runtime: Runtime,
) -> None:
    job_id = _submit(runtime)
    with unit_of_work(runtime.sessions) as session:
        claim = claim_step(
            session, StepKey(job_id, "slow"), task_id="t", lease_s=LEASE_S, now=utcnow()
        )

    assert claim is None
    assert _row(runtime, StepKey(job_id, "slow")).status == "pending"


def test_a_second_delivery_waits_while_the_lease_is_live(runtime: Runtime) -> None:
    job_id = _submit(runtime)
    _claim(runtime, StepKey(job_id, "before"))

    with pytest.raises(RetryLater), unit_of_work(runtime.sessions) as session:
        claim_step(session, StepKey(job_id, "before"), task_id="t", lease_s=LEASE_S, now=utcnow())


def test_an_expired_lease_is_taken_over_and_the_old_holder_cannot_finish(
    runtime: Runtime,
) -> None:
    key = StepKey(_submit(runtime), "before")
    stale = _claim(runtime, key)
    fresh = _claim(runtime, key, now_offset_s=LEASE_S + 1)

    with runtime.checkpoints.connect() as conn:
        assert not _complete(runtime, conn, key, stale.lease, {"from": "stale"})
    assert _row(runtime, key).status == "running"

    with runtime.checkpoints.connect() as conn:
        assert _complete(runtime, conn, key, fresh.lease, {"from": "fresh"})
        assert not _complete(runtime, conn, key, fresh.lease, {"from": "again"})
    with unit_of_work(runtime.sessions) as session:
        outputs = session.scalars(
            select(StepRunRow.output).where(
                StepRunRow.job_id == key.job_id, StepRunRow.output.is_not(None)
            )
        ).all()
    assert outputs == [{"from": "fresh"}]
    assert _row(runtime, key).attempts == 2


def test_a_failure_reported_under_a_lost_lease_is_ignored(runtime: Runtime) -> None:
    key = StepKey(_submit(runtime), "before")
    _claim(runtime, key)
    error = {"code": "x", "message": "late", "details": {}}
    with unit_of_work(runtime.sessions) as session:
        failed = fail_step(
            session, key, Lease("not-mine", 1), error, retry_delay_s=None, now=utcnow()
        )

    assert not failed.job_over and not failed.ready.steps
    assert _row(runtime, key).status == "running"


def test_a_retryable_failure_frees_the_step_for_the_next_attempt(runtime: Runtime) -> None:
    key = StepKey(_submit(runtime), "before")
    claim = _claim(runtime, key)
    error = {"code": "x", "message": "flaky", "details": {}}
    with unit_of_work(runtime.sessions) as session:
        fail_step(session, key, claim.lease, error, retry_delay_s=1.0, now=utcnow())

    assert _row(runtime, key).status == "retrying"
    assert _claim(runtime, key).lease.attempt == 2


def test_only_the_holder_of_a_lease_can_release_it_for_the_next_delivery(
    runtime: Runtime,
) -> None:
    key = StepKey(_submit(runtime), "before")
    claim = _claim(runtime, key)
    with runtime.claims.connect() as conn:
        release_lease(conn, key, Lease("not-mine", 1), utcnow())
    with pytest.raises(RetryLater), unit_of_work(runtime.sessions) as session:
        claim_step(session, key, task_id="t", lease_s=LEASE_S, now=utcnow())

    with runtime.claims.connect() as conn:
        release_lease(conn, key, claim.lease, utcnow())
    assert _claim(runtime, key).lease.attempt == 2


def test_a_released_lease_is_neither_renewed_nor_finished_by_its_old_holder(
    runtime: Runtime,
) -> None:
    key = StepKey(_submit(runtime), "before")
    claim = _claim(runtime, key)
    with runtime.claims.connect() as conn:
        release_lease(conn, key, claim.lease, utcnow())

    with unit_of_work(runtime.sessions) as session:
        assert not renew_lease(session, key, claim.lease, LEASE_S, utcnow())
    with runtime.checkpoints.connect() as conn:
        assert not _complete(runtime, conn, key, claim.lease, {"late": True})


def test_a_cancelled_job_stops_every_later_claim(runtime: Runtime) -> None:
    job_id = _submit(runtime)
    claim = _claim(runtime, StepKey(job_id, "before"))
    with unit_of_work(runtime.sessions) as session:
        _, task_ids = cancel_job(session, job_id, owner=None, now=utcnow())
    assert len(task_ids) == 1

    with pytest.raises(StopChain), unit_of_work(runtime.sessions) as session:
        claim_step(session, StepKey(job_id, "after"), task_id="t", lease_s=LEASE_S, now=utcnow())
    with runtime.checkpoints.connect() as conn:
        assert not _complete(runtime, conn, claim.key, claim.lease, {"late": True})
    with unit_of_work(runtime.sessions) as session:
        checkpoints = session.scalar(
            select(func.count())
            .select_from(StepRunRow)
            .where(StepRunRow.job_id == job_id, StepRunRow.output.is_not(None))
        )
        job = session.get(JobRow, job_id)
        assert job is not None and job.status == "cancelled"
    assert checkpoints == 0
