"""The counts an operator scrapes: open steps by status, read from the index that holds open
steps only, whatever the history kept beside them."""

import uuid
from collections.abc import Iterator

import pytest

from service.engine.runtime import Runtime
from service.engine.stats import steps_by_open_status
from service.platform.db import unit_of_work
from service.platform.models import JobRow
from service.platform.states import STEP_FINAL, JobStatus, StepStatus
from tests.support.arrange import walk
from tests.support.fanouts import submitted
from tests.support.scans import sequential_scans

ONE_STEP = {"name": "counted", "steps": [{"id": "a", "action": "noop"}]}


@pytest.fixture
def jobs(runtime: Runtime) -> Iterator[list[uuid.UUID]]:
    """The test's jobs, cancelled after it, so that a later test's sweep finds none of their
    steps waiting."""
    made: list[uuid.UUID] = []
    yield made
    with unit_of_work(runtime.sessions) as session:
        walk(session, JobRow, JobRow.id.in_(made), to=JobStatus.CANCELLED)


def _counts(rt: Runtime) -> tuple[dict[str, int], int]:
    """The counts, and the step table's sequential scans they took with those priced out."""
    with unit_of_work(rt.sessions) as session, sequential_scans(session, "step_runs") as taken:
        return steps_by_open_status(session), taken()


def test_every_open_status_is_counted_through_the_open_steps_index(
    runtime: Runtime, jobs: list[uuid.UUID]
) -> None:
    before, _ = _counts(runtime)
    jobs.append(submitted(runtime, ONE_STEP, {}))

    after, scans = _counts(runtime)

    assert set(after) == {status.value for status in StepStatus if status not in STEP_FINAL}
    assert after[StepStatus.PENDING] == before[StepStatus.PENDING] + 1
    assert scans == 0
