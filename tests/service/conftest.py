"""A Runtime on the test stack, for service functions that talk to PostgreSQL."""

import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.conftest import Stack

if TYPE_CHECKING:
    from service.engine.runtime import Runtime


@pytest.fixture(scope="session")
def runtime(stack: Stack) -> Iterator[object]:
    from service.engine.runtime import Runtime
    from service.platform.settings import get_settings

    rt = Runtime.start(get_settings())
    yield rt
    rt.sessions.kw["bind"].dispose()


@pytest.fixture
def leftovers(runtime: "Runtime") -> Iterator[list[uuid.UUID]]:
    """Jobs a test leaves open are cancelled afterwards. The database is shared with the e2e
    clusters, whose sweeper re-sends every open job after a broker wipe drill: a leftover
    job would be run there and hold up the drill's worker."""
    from service.engine.jobs import cancel_job
    from service.platform.clock import utcnow
    from service.platform.db import unit_of_work
    from service.platform.models import JobRow
    from service.platform.states import JOB_FINAL

    job_ids: list[uuid.UUID] = []
    yield job_ids
    with unit_of_work(runtime.sessions) as session:
        for job_id in job_ids:
            job = session.get(JobRow, job_id)
            if job is not None and job.status not in JOB_FINAL:
                cancel_job(session, job_id, owner=None, now=utcnow())
