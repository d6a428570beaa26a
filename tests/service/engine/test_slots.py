"""Step concurrency keys: at most ``limit`` steps of a key run at once across jobs; the others
wait ``awaiting_slot`` without a lease and are let in, oldest first, each into a slot kept for
it, when one frees or a holder's lease lapses."""

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from sqlalchemy import select, update

from service.engine.claims import fast_claim, use_fast_claim
from service.engine.runtime import Runtime
from service.engine.slots import let_in_steps
from service.engine.steps import Claimed, StepKey
from service.platform.clock import utcnow
from service.platform.db import driver, unit_of_work
from service.platform.models import JobRow, StepRunRow
from service.platform.states import JOB_OPEN, JobStatus, StepStatus
from tests.support.arrange import walk
from tests.support.fanouts import submitted
from tests.support.scans import sequential_scans

LEASE_S = 30.0
OPEN = [status.value for status in JOB_OPEN]


def _profile(key: str) -> dict[str, object]:
    return {
        "name": "shared-service",
        "steps": [{"id": "call", "action": "noop", "concurrency": {"key": key, "limit": 1}}],
    }


def _claim(rt: Runtime, job_id: uuid.UUID, now: datetime) -> object:
    key = StepKey(job_id, "call")
    with unit_of_work(rt.sessions) as session:
        fast = fast_claim(driver(session), key, task_id="t", lease_s=LEASE_S, now=now)
        assert fast is not None, "the lease is taken before the slot is asked for"
        return use_fast_claim(session, key, fast, now)


def _row(rt: Runtime, job_id: uuid.UUID) -> StepRunRow:
    with unit_of_work(rt.sessions) as session:
        row = session.scalars(select(StepRunRow).where(StepRunRow.job_id == job_id)).one()
        session.expunge(row)
        return row


def _let_in(rt: Runtime, now: datetime) -> set[uuid.UUID]:
    with unit_of_work(rt.sessions) as session:
        return {plan.job_id for plan in let_in_steps(session, now) if plan.steps}


@pytest.fixture
def shared(runtime: Runtime) -> Iterator[dict[str, object]]:
    """A key of this test's own. Its jobs end cancelled, so that a sweep pass of a later test
    in this database finds nothing these left half-way (a step settled without a checkpoint)."""
    yield _profile(f"svc-{uuid.uuid4().hex[:8]}")
    with unit_of_work(runtime.sessions) as session:
        walk(session, JobRow, JobRow.status.in_(OPEN), to=JobStatus.CANCELLED)


def test_a_step_over_its_keys_limit_waits_without_its_lease(
    runtime: Runtime, shared: dict[str, object]
) -> None:
    first, second = submitted(runtime, shared, {}), submitted(runtime, shared, {})
    now = utcnow()

    assert isinstance(_claim(runtime, first, now), Claimed)
    assert _claim(runtime, second, now) is None

    waiting = _row(runtime, second)
    assert waiting.status == StepStatus.AWAITING_SLOT
    assert (waiting.lease_token, waiting.attempts) == (None, 0), "its attempt is not counted"
    assert _let_in(runtime, now) == set(), "the slot is held"


def test_a_freed_slot_is_kept_for_the_oldest_waiting_step(
    runtime: Runtime, shared: dict[str, object]
) -> None:
    holder, oldest, newer = (submitted(runtime, shared, {}) for _ in range(3))
    now = utcnow()
    _claim(runtime, holder, now)
    _claim(runtime, oldest, now)
    _claim(runtime, newer, now + timedelta(seconds=1))

    with unit_of_work(runtime.sessions) as session:
        walk(session, StepRunRow, StepRunRow.job_id == holder, to=StepStatus.SUCCEEDED)
    assert _let_in(runtime, now) == {oldest}

    late = submitted(runtime, shared, {})
    assert _claim(runtime, late, now) is None, "the slot is kept for the step let in"
    assert isinstance(_claim(runtime, oldest, now), Claimed)
    assert _row(runtime, newer).status == StepStatus.AWAITING_SLOT


def test_a_step_starts_when_it_takes_its_slot_not_when_it_was_claimed(
    runtime: Runtime, shared: dict[str, object]
) -> None:
    """A holder that ended between a step's claim and its asking for a slot ended before that
    step began: the two never show as running at once."""
    holder, following = submitted(runtime, shared, {}), submitted(runtime, shared, {})
    claimed_at = utcnow()
    _claim(runtime, holder, claimed_at)
    with unit_of_work(runtime.sessions) as session:
        walk(session, StepRunRow, StepRunRow.job_id == holder, to=StepStatus.SUCCEEDED)
        ended = utcnow()
        session.execute(
            update(StepRunRow).where(StepRunRow.job_id == holder).values(finished_at=ended)
        )

    assert isinstance(_claim(runtime, following, claimed_at), Claimed)
    started = _row(runtime, following).started_at
    assert started is not None and started > ended


def test_a_slot_held_by_a_lapsed_lease_goes_to_the_next(
    runtime: Runtime, shared: dict[str, object]
) -> None:
    """A worker killed under its step announces nothing: its lease lapsing frees the slot."""
    holder, waiting = submitted(runtime, shared, {}), submitted(runtime, shared, {})
    now = utcnow()
    _claim(runtime, holder, now)
    _claim(runtime, waiting, now)

    mine = {holder, waiting}
    assert _let_in(runtime, now + timedelta(seconds=LEASE_S - 1)) & mine == set()
    assert _let_in(runtime, now + timedelta(seconds=LEASE_S + 1)) & mine == {waiting}


def test_letting_steps_in_reads_no_step_row_but_those_it_lets_in(
    runtime: Runtime, shared: dict[str, object]
) -> None:
    """The leader looks several times a second while steps wait: a let-in that read every step
    row ever kept would grow with the history. With sequential scans priced out, the let-in
    still scans the table only if no index can find what it lets in."""
    holder, waiting = submitted(runtime, shared, {}), submitted(runtime, shared, {})
    now = utcnow()
    _claim(runtime, holder, now)
    _claim(runtime, waiting, now)
    with unit_of_work(runtime.sessions) as session:
        walk(session, StepRunRow, StepRunRow.job_id == holder, to=StepStatus.SUCCEEDED)

    with unit_of_work(runtime.sessions) as session, sequential_scans(session, "step_runs") as taken:
        let_in = {plan.job_id for plan in let_in_steps(session, now)}
        scans = taken()

    assert waiting in let_in
    assert scans == 0


@pytest.mark.usefixtures("shared")
def test_different_keys_do_not_share_slots(runtime: Runtime) -> None:
    one = submitted(runtime, _profile(f"a-{uuid.uuid4().hex[:6]}"), {})
    other = submitted(runtime, _profile(f"b-{uuid.uuid4().hex[:6]}"), {})
    now = utcnow()

    assert isinstance(_claim(runtime, one, now), Claimed)
    assert isinstance(_claim(runtime, other, now), Claimed)
