"""A for_each step's shards: one row per item however many, recorded in the claim's transaction."""

import uuid
from typing import Any

from sqlalchemy import select

from service.engine.claims import claim_step
from service.engine.runtime import Runtime
from service.engine.shards import FannedOut, fan_out
from service.engine.steps import Completion, FanOutDue, StepKey, Unresolvable
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from service.platform.models import JobRow, StepRunRow
from tests.support.fanouts import fan_profile, submitted

LEASE_S = 30.0


def fanned_out(
    rt: Runtime,
    items: Any,
    items_type: str = "array",
    max_items: int = 100_000,
    max_job_steps: int = 1_000_000,
) -> tuple[StepKey, FannedOut | Unresolvable | Completion]:
    key = StepKey(submitted(rt, fan_profile(items_type=items_type), {"items": items}), "each")
    with unit_of_work(rt.sessions) as session:
        due = claim_step(session, key, task_id=uuid.uuid4().hex, lease_s=LEASE_S, now=utcnow())
        assert isinstance(due, FanOutDue)
        now = utcnow()
        return key, fan_out(session, due, now, max_items=max_items, max_job_steps=max_job_steps)


def test_ten_thousand_items_fan_out_past_the_limit_of_bound_parameters(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    key, fanned = fanned_out(runtime, list(range(10_000)))
    leftovers.append(key.job_id)

    assert isinstance(fanned, FannedOut)
    assert fanned.shards == list(range(10_000))
    assert (fanned.max_parallel, fanned.timeout_s) == (2, 300)


def test_no_items_succeed_the_step_at_once_with_an_empty_list(runtime: Runtime) -> None:
    key, fanned = fanned_out(runtime, [])

    assert isinstance(fanned, Completion) and fanned.written
    with runtime.sessions() as session:
        output = session.scalar(
            select(StepRunRow.output).where(
                StepRunRow.job_id == key.job_id,
                StepRunRow.output.is_not(None),
                StepRunRow.step_id == "each",
            )
        )
        job = session.get(JobRow, key.job_id)
    assert output == []
    assert job is not None and job.status == "succeeded" and job.result == {"each": []}


def test_more_items_than_the_limit_fail_the_step_for_good_and_record_no_shard(
    runtime: Runtime,
) -> None:
    key, fanned = fanned_out(runtime, list(range(11)), max_items=10)

    assert isinstance(fanned, Unresolvable) and fanned.job_over
    with runtime.sessions() as session:
        rows = session.scalars(select(StepRunRow).where(StepRunRow.job_id == key.job_id)).all()
    assert [(row.shard, row.status) for row in rows] == [(-1, "failed")]
    assert rows[0].error is not None and rows[0].error["code"] == "fanout_too_large"
    assert rows[0].error["details"] == {"items": 11, "limit": 10}


def test_items_that_would_take_the_job_past_its_step_limit_fail_the_step_and_record_no_shard(
    runtime: Runtime,
) -> None:
    """The job already holds one step row, the fan-out's own; five items would make six."""
    key, fanned = fanned_out(runtime, list(range(5)), max_items=10, max_job_steps=5)

    assert isinstance(fanned, Unresolvable) and fanned.job_over
    with runtime.sessions() as session:
        rows = session.scalars(select(StepRunRow).where(StepRunRow.job_id == key.job_id)).all()
    assert [(row.shard, row.status) for row in rows] == [(-1, "failed")]
    assert rows[0].error is not None and rows[0].error["code"] == "job_too_large"
    assert rows[0].error["details"] == {"steps": 6, "limit": 5}
    _, within = fanned_out(runtime, list(range(5)), max_items=10, max_job_steps=6)
    assert isinstance(within, FannedOut)


def test_items_that_are_not_a_list_fail_the_step_and_record_no_shard(runtime: Runtime) -> None:
    key, fanned = fanned_out(runtime, {"not": "a list"}, items_type="object")

    assert isinstance(fanned, Unresolvable) and fanned.job_over
    with runtime.sessions() as session:
        rows = session.scalars(select(StepRunRow).where(StepRunRow.job_id == key.job_id)).all()
    assert [(row.shard, row.status) for row in rows] == [(-1, "failed")]
    assert rows[0].error is not None and rows[0].error["code"] == "bad_reference"
