"""PostgreSQL holds the lifecycle table: a status the table does not allow is refused by the
database, whichever code writes it."""

import uuid

import pytest
from sqlalchemy import create_engine, select, text, update
from sqlalchemy.exc import IntegrityError

from service.engine.runtime import Runtime
from service.platform import lifecycle
from service.platform.db import unit_of_work
from service.platform.models import JobRow, StepRunRow
from service.platform.states import STEP_TRANSITIONS, JobStatus, StepStatus
from tests.conftest import Stack
from tests.support.fanouts import submitted

CHAIN = {
    "name": "lifecycle-chain",
    "steps": [{"id": "a", "action": "noop"}, {"id": "b", "action": "noop", "depends_on": ["a"]}],
}


def _set(rt: Runtime, job_id: uuid.UUID, step_id: str, status: StepStatus) -> None:
    with unit_of_work(rt.sessions) as session:
        session.execute(
            update(StepRunRow)
            .where(StepRunRow.job_id == job_id, StepRunRow.step_id == step_id)
            .values(status=status)
        )


def test_the_database_holds_the_table_as_migrated(stack: Stack) -> None:
    engine = create_engine(stack.database_url)
    with engine.begin() as connection:
        assert not lifecycle.sync(connection), "the migration wrote it already"
        body = connection.scalar(
            text("SELECT prosrc FROM pg_proc WHERE proname = :name"), {"name": lifecycle.FUNCTION}
        )
    engine.dispose()
    assert body == lifecycle.function_body()
    moves = lifecycle.allowed_moves()
    assert {f"step:{t.before}>{t.after}" for t in STEP_TRANSITIONS} <= set(moves)


def test_a_move_the_table_allows_is_written(runtime: Runtime, leftovers: list[uuid.UUID]) -> None:
    job_id = submitted(runtime, CHAIN, {})
    leftovers.append(job_id)
    _set(runtime, job_id, "a", StepStatus.RUNNING)
    _set(runtime, job_id, "a", StepStatus.SUCCEEDED)


def test_a_move_the_table_does_not_have_is_refused_and_nothing_is_written(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    job_id = submitted(runtime, CHAIN, {})
    leftovers.append(job_id)
    with pytest.raises(IntegrityError, match="step:pending>succeeded"):
        _set(runtime, job_id, "a", StepStatus.SUCCEEDED)
    with (
        pytest.raises(IntegrityError, match="job:queued>awaiting_approval"),
        unit_of_work(runtime.sessions) as session,
    ):
        session.execute(
            update(JobRow).where(JobRow.id == job_id).values(status=JobStatus.AWAITING_APPROVAL)
        )
    with unit_of_work(runtime.sessions) as session:
        job = session.get(JobRow, job_id)
        assert job is not None and job.status == JobStatus.QUEUED
        steps = session.scalars(select(StepRunRow).where(StepRunRow.job_id == job_id))
        assert {row.status for row in steps} == {StepStatus.PENDING}


def test_a_row_cannot_be_stored_in_a_status_it_may_not_start_in(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    job_id = submitted(runtime, CHAIN, {})
    leftovers.append(job_id)
    with (
        pytest.raises(IntegrityError, match="step:>running"),
        unit_of_work(runtime.sessions) as session,
    ):
        session.add(StepRunRow(job_id=job_id, step_id="z", shard=-1, status=StepStatus.RUNNING))
