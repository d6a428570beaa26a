"""Concurrency keys: at most ``limit`` open jobs of a pipeline share a key's value; the others
wait queued, unsent and unclaimable, and are let in as slots free, the most urgent first and the
oldest of those first. Fair share: jobs wait their turn, round-robin by owner, each owner's
most urgent first."""

import asyncio
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from sqlalchemy import select, text

from service.catalogue.resolution import ResolvedPipeline
from service.engine.claims import fast_claim
from service.engine.concurrency import let_in_all, take_turns
from service.engine.intake import NewJob, insert_jobs_if_resolved, new_job
from service.engine.runtime import Runtime
from service.engine.steps import StepKey
from service.engine.submission import JobRequest, submit_job
from service.engine.sweeper import sweep
from service.language.checks import validate_profile
from service.platform.clock import utcnow
from service.platform.db import driver, libpq_url, unit_of_work
from service.platform.errors import FlowbeatError
from service.platform.models import JobRow
from service.platform.states import JOB_OPEN, JobStatus
from tests.support.arrange import walk
from tests.support.locks import wait_for_a_lock_waiter

TENANTS = {
    "name": "per-tenant",
    "params": {"tenant": {"type": "string"}},
    "concurrency": {"key": "${{ params.tenant }}", "limit": 2},
    "steps": [{"id": "call", "action": "noop"}],
}


def _submit(
    rt: Runtime,
    owner: str,
    tenant: str,
    profile: dict[str, Any] = TENANTS,
    priority: int | None = None,
) -> JobRow:
    with unit_of_work(rt.sessions) as session:
        job, _ = submit_job(
            session,
            JobRequest(pipeline=profile, params={"tenant": tenant}, priority=priority),
            owner=owner,
            profiles_dir=rt.settings.profiles_dir,
            known_actions=rt.registry.names(),
        )
    return job


def _waiting(rt: Runtime, ids: list[uuid.UUID]) -> list[bool]:
    with unit_of_work(rt.sessions) as session:
        rows = {j.id: j for j in session.scalars(select(JobRow).where(JobRow.id.in_(ids)))}
        return [rows[i].waiting_for is not None for i in ids]


def _finish(rt: Runtime, job_id: uuid.UUID) -> None:
    with unit_of_work(rt.sessions) as session:
        walk(session, JobRow, JobRow.id == job_id, to=JobStatus.SUCCEEDED)


@pytest.fixture
def owner() -> str:
    return f"o-{uuid.uuid4().hex[:8]}"


def test_jobs_over_the_limit_of_their_key_wait_unsent_and_others_keys_do_not(
    runtime: Runtime, owner: str
) -> None:
    jobs = [_submit(runtime, owner, "acme") for _ in range(4)]
    other = _submit(runtime, owner, "globex")

    assert [job.waiting_for for job in jobs] == [None, None, "concurrency", "concurrency"]
    assert [job.dispatched_at is None for job in jobs] == [False, False, True, True]
    assert other.waiting_for is None
    assert jobs[0].concurrency_key == f"{owner}/per-tenant/acme"


def test_a_freed_slot_goes_to_the_oldest_waiting_job(runtime: Runtime, owner: str) -> None:
    first, second, third, fourth = (_submit(runtime, owner, "acme").id for _ in range(4))
    with unit_of_work(runtime.sessions) as session:
        assert let_in_all(session, utcnow()) == [], "no slot is free yet"

    _finish(runtime, first)
    with unit_of_work(runtime.sessions) as session:
        admitted = let_in_all(session, utcnow())

    assert admitted == [third]
    assert _waiting(runtime, [second, third, fourth]) == [False, False, True]


def test_a_freed_slot_goes_to_the_most_urgent_waiting_job_then_the_oldest(
    runtime: Runtime, owner: str
) -> None:
    first, second = (_submit(runtime, owner, "acme").id for _ in range(2))
    low = [_submit(runtime, owner, "acme").id for _ in range(3)]
    urgent = _submit(runtime, owner, "acme", priority=9).id
    _finish(runtime, first)
    with unit_of_work(runtime.sessions) as session:
        assert let_in_all(session, utcnow()) == [urgent]

    _finish(runtime, second)
    with unit_of_work(runtime.sessions) as session:
        assert let_in_all(session, utcnow()) == [low[0]], "then the oldest of the rest"


def test_slots_freed_at_once_go_once_each_to_the_most_urgent_whoever_lets_them_in(
    runtime: Runtime, owner: str
) -> None:
    """The beat leader and a sweeper letting in at the same moment: each takes the key's lock
    in turn and counts after it, so the two slots go to the two most urgent jobs, once."""
    holders = [_submit(runtime, owner, "both").id for _ in range(2)]
    waiting = [_submit(runtime, owner, "both", priority=p).id for p in (0, 5, 1, 9, 0, 3)]
    for job in holders:
        _finish(runtime, job)

    def let_in_now(_: int) -> list[uuid.UUID]:
        with unit_of_work(runtime.sessions) as session:
            return let_in_all(session, utcnow())

    with ThreadPoolExecutor(max_workers=4) as pool:
        admitted = [job for jobs in pool.map(let_in_now, range(4)) for job in jobs]

    assert sorted(admitted) == sorted([waiting[3], waiting[1]])
    assert _held(runtime, owner, "both") == 2


def test_a_new_job_does_not_pass_one_waiting_ahead_of_it(runtime: Runtime, owner: str) -> None:
    first, _, waiting = (_submit(runtime, owner, "acme").id for _ in range(3))
    _finish(runtime, first)

    late = _submit(runtime, owner, "acme")

    assert late.waiting_for == "concurrency", "the slot is the older job's"
    with unit_of_work(runtime.sessions) as session:
        assert let_in_all(session, utcnow()) == [waiting]


def test_a_waiting_jobs_message_claims_nothing(runtime: Runtime, owner: str) -> None:
    for _ in range(2):
        _submit(runtime, owner, "acme")
    waiting = _submit(runtime, owner, "acme")
    with unit_of_work(runtime.sessions) as session:
        claim = fast_claim(
            driver(session),
            StepKey(waiting.id, "call"),
            task_id="early",
            lease_s=30,
            now=utcnow(),
        )
    assert claim is None


def test_many_submissions_at_once_take_exactly_the_free_slots(runtime: Runtime, owner: str) -> None:
    with ThreadPoolExecutor(max_workers=8) as pool:
        jobs = list(pool.map(lambda _: _submit(runtime, owner, "race"), range(12)))

    assert sum(job.waiting_for is None for job in jobs) == 2
    with unit_of_work(runtime.sessions) as session:
        assert let_in_all(session, utcnow()) == []


def test_the_sweeper_never_sends_a_job_waiting_for_a_slot(runtime: Runtime, owner: str) -> None:
    for _ in range(2):
        _submit(runtime, owner, "acme")
    waiting = _submit(runtime, owner, "acme")
    with unit_of_work(runtime.sessions) as session:
        report = sweep(
            session,
            now=utcnow().replace(year=utcnow().year + 1),
            broker_lost=True,
            stall_after_s=1,
            dispatch_grace_s=1,
        )
    assert waiting.id not in report.redispatch


def test_a_key_reads_only_params_and_one_it_cannot_resolve_is_refused(
    runtime: Runtime, owner: str
) -> None:
    unknown = {**TENANTS, "concurrency": {"key": "${{ params.region }}", "limit": 1}}
    with pytest.raises(FlowbeatError) as refused:
        _submit(runtime, owner, "acme", unknown)
    assert "region" in refused.value.message
    with unit_of_work(runtime.sessions) as session:
        assert session.scalar(select(JobRow.id).where(JobRow.owner == owner)) is None


PLAIN = {"name": "plain-turns", "steps": [{"id": "call", "action": "noop"}]}


def _submit_turn(rt: Runtime, owner: str, ahead: int = 2, priority: int | None = None) -> JobRow:
    with unit_of_work(rt.sessions) as session:
        job, _ = submit_job(
            session,
            JobRequest(pipeline=PLAIN, params={}, priority=priority),
            owner=owner,
            profiles_dir=rt.settings.profiles_dir,
            known_actions=rt.registry.names(),
            fair_share_ahead=ahead,
        )
    return job


def _start(rt: Runtime, job_id: uuid.UUID) -> None:
    with unit_of_work(rt.sessions) as session:
        walk(session, JobRow, JobRow.id == job_id, to=JobStatus.RUNNING)


@pytest.fixture
def no_other_turns(runtime: Runtime) -> Iterator[None]:
    """Fair share counts every job sent and not started: these tests start from none."""
    with unit_of_work(runtime.sessions) as session:
        walk(session, JobRow, JobRow.status == JobStatus.QUEUED, to=JobStatus.CANCELLED)
    yield
    with unit_of_work(runtime.sessions) as session:
        walk(session, JobRow, JobRow.status.in_(["queued", "running"]), to=JobStatus.CANCELLED)


@pytest.mark.usefixtures("no_other_turns")
def test_a_burst_waits_its_turn_and_another_owners_job_goes_next(runtime: Runtime) -> None:
    big, small = f"big-{uuid.uuid4().hex[:6]}", f"small-{uuid.uuid4().hex[:6]}"
    burst = [_submit_turn(runtime, big) for _ in range(10)]
    late = _submit_turn(runtime, small)

    assert [job.waiting_for for job in burst[:3]] == [None, None, "turn"]
    assert late.waiting_for == "turn", "two are sent ahead already"

    for job in burst[:2]:
        _start(runtime, job.id)
    with unit_of_work(runtime.sessions) as session:
        turns = take_turns(session, 2, sent_at=utcnow())

    assert set(turns) == {burst[2].id, late.id}, "each owner's oldest, owner by owner"
    with unit_of_work(runtime.sessions) as session:
        assert take_turns(session, 2, sent_at=utcnow()) == [], "two are sent ahead again"


@pytest.mark.usefixtures("no_other_turns")
def test_a_job_takes_its_turn_at_once_while_room_is_left(runtime: Runtime) -> None:
    owner = f"o-{uuid.uuid4().hex[:6]}"
    job = _submit_turn(runtime, owner, ahead=5)

    assert job.waiting_for is None and job.dispatched_at is not None


@pytest.mark.usefixtures("no_other_turns")
def test_one_free_place_goes_to_the_owner_with_nothing_running(runtime: Runtime) -> None:
    """Taken one at a time, turns still alternate: the owner whose jobs run goes after the
    one whose do not, however older its waiting jobs are."""
    big, small = f"big-{uuid.uuid4().hex[:6]}", f"small-{uuid.uuid4().hex[:6]}"
    burst = [_submit_turn(runtime, big, ahead=1) for _ in range(5)]
    late = _submit_turn(runtime, small, ahead=1)
    _start(runtime, burst[0].id)

    with unit_of_work(runtime.sessions) as session:
        assert take_turns(session, 1, sent_at=utcnow()) == [late.id]


@pytest.mark.usefixtures("no_other_turns")
def test_an_owners_turn_goes_to_its_most_urgent_job_held_back(runtime: Runtime) -> None:
    owner = f"o-{uuid.uuid4().hex[:6]}"
    first, *low = [_submit_turn(runtime, owner, ahead=1) for _ in range(4)]
    urgent = _submit_turn(runtime, owner, ahead=1, priority=9)
    assert [job.waiting_for for job in [*low, urgent]] == ["turn"] * 4
    _start(runtime, first.id)

    with unit_of_work(runtime.sessions) as session:
        assert take_turns(session, 1, sent_at=utcnow()) == [urgent.id]
    _start(runtime, urgent.id)
    with unit_of_work(runtime.sessions) as session:
        assert take_turns(session, 1, sent_at=utcnow()) == [low[0].id], "then the oldest"


@pytest.mark.usefixtures("no_other_turns")
def test_a_priority_never_takes_another_owners_turn(runtime: Runtime) -> None:
    """Each owner sets its own jobs' priorities: an owner that marked every job 9 would
    otherwise take every turn, and fair share would protect nobody."""
    big, small = f"big-{uuid.uuid4().hex[:6]}", f"small-{uuid.uuid4().hex[:6]}"
    running = _submit_turn(runtime, big, ahead=1)
    late = _submit_turn(runtime, small, ahead=1)
    _submit_turn(runtime, big, ahead=1, priority=9)
    _start(runtime, running.id)

    with unit_of_work(runtime.sessions) as session:
        assert take_turns(session, 1, sent_at=utcnow()) == [late.id], "big has had its turn"


@pytest.mark.usefixtures("no_other_turns")
def test_among_owners_whose_turn_is_the_same_the_most_urgent_goes_first(
    runtime: Runtime,
) -> None:
    first, second, third = (f"o{n}-{uuid.uuid4().hex[:6]}" for n in range(3))
    ahead_of_them = _submit_turn(runtime, first, ahead=1)
    _submit_turn(runtime, second, ahead=1)
    urgent = _submit_turn(runtime, third, ahead=1, priority=9)
    _start(runtime, ahead_of_them.id)

    with unit_of_work(runtime.sessions) as session:
        assert take_turns(session, 1, sent_at=utcnow()) == [urgent.id], "not the older one"


def _submit_to(rt: Runtime, owner: str, queue: str, ahead: int) -> JobRow:
    profile = {**PLAIN, "name": f"turns-{queue}", "queue": queue}
    with unit_of_work(rt.sessions) as session:
        job, _ = submit_job(
            session,
            JobRequest(pipeline=profile, params={}),
            owner=owner,
            profiles_dir=rt.settings.profiles_dir,
            known_actions=rt.registry.names(),
            fair_share_ahead=ahead,
        )
    return job


@pytest.mark.usefixtures("no_other_turns")
def test_a_queue_no_worker_takes_from_holds_back_only_its_own_jobs(runtime: Runtime) -> None:
    """Turns are counted queue by queue: jobs sent to a pool that has not started yet are
    never started, and must not hold back the default queue's jobs."""
    owner = f"o-{uuid.uuid4().hex[:6]}"
    stuck = [_submit_to(runtime, owner, "gpu", ahead=2) for _ in range(3)]
    plain = _submit_to(runtime, owner, "default", ahead=2)

    assert [job.queue for job in stuck] == ["gpu"] * 3 and plain.queue == "default"
    assert [job.waiting_for for job in stuck] == [None, None, "turn"]
    assert plain.waiting_for is None, "two jobs sent to another queue are not ahead of it"
    with unit_of_work(runtime.sessions) as session:
        assert take_turns(session, 2, sent_at=utcnow()) == [], "the gpu queue is full"


def _held(rt: Runtime, owner: str, tenant: str) -> int:
    with unit_of_work(rt.sessions) as session:
        return len(
            session.scalars(
                select(JobRow.id).where(
                    JobRow.concurrency_key == f"{owner}/per-tenant/{tenant}",
                    JobRow.waiting_for.is_(None),
                    JobRow.status.in_(sorted(JOB_OPEN)),
                )
            ).all()
        )


def _lane_job(rt: Runtime, owner: str, tenant: str, priority: int | None = None) -> NewJob:
    profile = validate_profile(dict(TENANTS), source="inline", known_actions=rt.registry.names())
    request = JobRequest(pipeline="per-tenant", params={"tenant": tenant}, priority=priority)
    return new_job(request, ResolvedPipeline(profile, None, None), owner=owner, name="per-tenant")


def _store_on_the_lane(rt: Runtime, jobs: list[NewJob]) -> set[uuid.UUID]:
    async def insert() -> set[uuid.UUID]:
        url = libpq_url(rt.settings.require_database_url())
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            return await insert_jobs_if_resolved(conn, jobs, open_jobs_limit=0)

    return asyncio.run(insert())


def _second_by_route(rt: Runtime, owner: str) -> JobRow:
    return _submit(rt, owner, "last")


def _second_by_lane(rt: Runtime, owner: str) -> JobRow:
    job = _lane_job(rt, owner, "last")
    assert _store_on_the_lane(rt, [job]) == {job.id}
    return JobRow(**job.values)


@pytest.mark.parametrize("second_by", [_second_by_route, _second_by_lane], ids=["route", "lane"])
@pytest.mark.parametrize("first_ends", ["commit", "rollback"])
def test_two_submissions_racing_for_the_last_slot_take_it_once(
    runtime: Runtime, owner: str, first_ends: str, second_by: Callable[[Runtime, str], JobRow]
) -> None:
    """Two API processes, each on its own connection: the second asks for the key's last slot
    while the first holds it uncommitted, so it waits for the first's key lock, then counts
    what the first left (its job, or none)."""
    _submit(runtime, owner, "last")
    session = runtime.sessions()
    try:
        first, _ = submit_job(
            session,
            JobRequest(pipeline=TENANTS, params={"tenant": "last"}),
            owner=owner,
            profiles_dir=runtime.settings.profiles_dir,
            known_actions=runtime.registry.names(),
        )
        assert first.waiting_for is None, "the last slot is the first's while it holds it"
        with ThreadPoolExecutor(max_workers=1) as pool:
            second = pool.submit(second_by, runtime, owner)
            wait_for_a_lock_waiter(runtime, "the second submission, behind the first's key,")
            getattr(session, first_ends)()
            late = second.result(timeout=10)
    finally:
        session.close()

    if first_ends == "commit":
        assert late.waiting_for == "concurrency" and late.dispatched_at is None
    else:
        assert late.waiting_for is None and late.dispatched_at is not None
    assert _held(runtime, owner, "last") == 2


_JOB_WRITES = text(
    "SELECT n_tup_ins, n_tup_upd FROM pg_stat_xact_user_tables WHERE relname = 'jobs'"
)
"""This backend's writes to ``jobs`` not yet in the shared statistics: compared before and after
within one transaction, what its statements wrote."""


def test_a_job_with_room_is_stored_let_in_by_its_insert_and_wakes_nobody(
    runtime: Runtime, owner: str
) -> None:
    """The usual case costs one write of the job row and no notice to the beat; a job left
    waiting is announced, so the beat lets it in when a slot frees."""
    heard: list[str] = []
    url = libpq_url(runtime.settings.require_database_url())
    with psycopg.connect(url, autocommit=True) as beat:
        beat.add_notify_handler(lambda notice: heard.append(notice.payload))
        beat.execute("LISTEN flowbeat_schedules")
        with unit_of_work(runtime.sessions) as session:
            before = session.execute(_JOB_WRITES).one()
            job, _ = submit_job(
                session,
                JobRequest(pipeline=TENANTS, params={"tenant": "quiet"}),
                owner=owner,
                profiles_dir=runtime.settings.profiles_dir,
                known_actions=runtime.registry.names(),
            )
            after = session.execute(_JOB_WRITES).one()
        beat.execute("SELECT 1")
        assert (job.waiting_for, job.dispatched_at is not None) == (None, True)
        writes = tuple(a - b for a, b in zip(after, before, strict=True))
        assert writes == (1, 0), "inserted let in, not updated after"
        assert heard == []

        _submit(runtime, owner, "quiet")
        _submit(runtime, owner, "quiet")
        beat.execute("SELECT 1")
        assert heard == ["concurrency"], "only the job over the limit wakes the beat"


def test_a_batch_of_one_key_takes_its_free_slots_in_order_and_the_rest_wait(
    runtime: Runtime, owner: str
) -> None:
    jobs = [_lane_job(runtime, owner, "batch") for _ in range(3)]

    assert _store_on_the_lane(runtime, jobs) == {job.id for job in jobs}

    assert [job.values["waiting_for"] for job in jobs] == [None, None, "concurrency"]
    assert [job.values["dispatched_at"] is None for job in jobs] == [False, False, True]
    assert _waiting(runtime, [job.id for job in jobs]) == [False, False, True]
    _finish(runtime, jobs[0].id)
    late = _lane_job(runtime, owner, "batch")
    _store_on_the_lane(runtime, [late])
    assert late.values["waiting_for"] == "concurrency", "the slot is the older job's"
    with unit_of_work(runtime.sessions) as session:
        assert let_in_all(session, utcnow()) == [jobs[2].id]


def test_a_batch_gives_its_keys_free_slots_to_its_most_urgent_jobs(
    runtime: Runtime, owner: str
) -> None:
    jobs = [_lane_job(runtime, owner, "urgent", priority=p) for p in (0, 0, 9)]

    _store_on_the_lane(runtime, jobs)

    assert [job.values["waiting_for"] for job in jobs] == [None, "concurrency", None]
