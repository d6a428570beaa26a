"""PostgreSQL holds the lifecycle table: a status the table does not allow is refused by the
database, whichever code writes it."""

import re
import uuid
from typing import Any

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


def test_a_status_change_is_checked_without_locking_the_row_first(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    """A ``BEFORE UPDATE`` trigger has PostgreSQL lock the row before the update, a WAL record
    of its own at every status change; the check runs after the write instead (ADR 21)."""
    job_id = submitted(runtime, CHAIN, {})
    leftovers.append(job_id)
    with runtime.claims.connect() as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        block, offset, start = conn.execute(
            "SELECT (ctid::text::point)[0]::int, (ctid::text::point)[1]::int,"
            " pg_current_wal_lsn() FROM step_runs WHERE job_id = %s AND step_id = 'a'",
            (job_id,),
        ).fetchone() or (0, 0, None)
    _set(runtime, job_id, "a", StepStatus.RUNNING)
    with runtime.claims.connect() as conn:
        records = conn.execute(
            "SELECT record_type, description FROM pg_get_wal_records_info(%s, pg_current_wal_lsn())"
            " WHERE resource_manager = 'Heap' AND block_ref LIKE %s",
            (start, f"%/{_relfile(conn)} fork main blk {block}%"),
        ).fetchall()

    at_offset = re.compile(rf"\b(?:old_)?off:? {offset}\b")
    mine = [kind for kind, description in records if at_offset.search(description)]
    assert "UPDATE" in mine or "HOT_UPDATE" in mine
    assert "LOCK" not in mine


def _relfile(conn: Any) -> int:
    return int(conn.execute("SELECT pg_relation_filenode('step_runs')").fetchone()[0])


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
