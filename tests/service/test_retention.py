"""Retention: every pipeline keeps its newest finished runs, however its jobs were started."""

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, update

from service.db import unit_of_work
from service.jobs import JobRequest, submit_job
from service.migrate import upgrade
from service.models import JobEventRow, JobRow, StepRunRow
from service.retention import prune_all
from service.runtime import Runtime
from service.settings import Settings
from tests.conftest import Stack
from tests.support.servers import admin_database_url, create_test_database, drop_test_database


@pytest.fixture(scope="module")
def runtime(stack: Stack) -> Iterator[Runtime]:
    """A database of its own: a pass prunes every owner's runs, other tests' included."""
    admin = admin_database_url()
    name = f"flowbeat_retention_{uuid.uuid4().hex[:8]}"
    url = create_test_database(admin, name)
    upgrade(url)
    rt = Runtime.start(Settings(database_url=url, broker_url=stack.broker_url))
    yield rt
    rt.sessions.kw["bind"].dispose()
    drop_test_database(admin, name)


ONE_STEP: dict[str, Any] = {"name": "kept", "steps": [{"id": "a", "action": "noop"}]}
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _jobs(rt: Runtime, owner: str, pipeline: str, statuses: list[str]) -> list[uuid.UUID]:
    """Jobs created an hour apart, oldest first, with the given statuses."""
    ids = []
    with unit_of_work(rt.sessions) as session:
        for n, status in enumerate(statuses):
            job, _ = submit_job(
                session,
                JobRequest(pipeline={**ONE_STEP, "name": pipeline}, params={}),
                owner=owner,
                profiles_dir=rt.settings.profiles_dir,
                known_actions=rt.registry.names(),
            )
            session.execute(
                update(JobRow)
                .where(JobRow.id == job.id)
                .values(status=status, created_at=T0 + timedelta(hours=n))
            )
            ids.append(job.id)
    return ids


def _left(rt: Runtime, ids: list[uuid.UUID]) -> list[uuid.UUID]:
    with unit_of_work(rt.sessions) as session:
        found = set(session.scalars(select(JobRow.id).where(JobRow.id.in_(ids))))
    return [job_id for job_id in ids if job_id in found]


def test_each_pipeline_of_each_owner_keeps_its_newest_finished_runs(runtime: Runtime) -> None:
    me, you = f"me-{uuid.uuid4().hex[:6]}", f"you-{uuid.uuid4().hex[:6]}"
    mine = _jobs(runtime, me, "kept", ["succeeded", "failed", "succeeded", "cancelled"])
    other = _jobs(runtime, me, "other", ["succeeded", "succeeded"])
    yours = _jobs(runtime, you, "kept", ["succeeded", "succeeded", "succeeded"])

    with unit_of_work(runtime.sessions) as session:
        prune_all(session, keep=2)

    assert _left(runtime, mine) == mine[2:]
    assert _left(runtime, other) == other
    assert _left(runtime, yours) == yours[1:]


def test_open_jobs_are_never_pruned_and_do_not_count_as_kept_runs(runtime: Runtime) -> None:
    owner = f"open-{uuid.uuid4().hex[:6]}"
    ids = _jobs(runtime, owner, "kept", ["queued", "succeeded", "succeeded", "running"])

    with unit_of_work(runtime.sessions) as session:
        prune_all(session, keep=1)

    assert _left(runtime, ids) == [ids[0], ids[3]]


def test_a_pruned_job_takes_its_steps_and_event_log_along(runtime: Runtime) -> None:
    owner = f"gone-{uuid.uuid4().hex[:6]}"
    old, new = _jobs(runtime, owner, "kept", ["succeeded", "succeeded"])

    with unit_of_work(runtime.sessions) as session:
        prune_all(session, keep=1)
        steps = session.scalar(select(func.count()).where(StepRunRow.job_id == old))
        events = session.scalar(select(func.count()).where(JobEventRow.job_id == old))
        kept = session.scalar(select(func.count()).where(JobEventRow.job_id == new))

    assert (steps, events) == (0, 0)
    assert kept


def test_a_pass_deletes_at_most_its_batch(runtime: Runtime) -> None:
    owner = f"batch-{uuid.uuid4().hex[:6]}"
    ids = _jobs(runtime, owner, "kept", ["succeeded"] * 5)

    with unit_of_work(runtime.sessions) as session:
        prune_all(session, keep=1, batch=2)

    assert len(_left(runtime, ids)) == 3
