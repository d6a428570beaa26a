"""Step rate limits: a step whose key's window has room runs; one that finds none parks
``awaiting_rate`` without its lease, its attempt uncounted, in a row of ``rate_waits``; the
beat's let-in sends the due ones back as many as the window has room for, and no sooner."""

import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta

import pytest
import redis
from sqlalchemy import select

from service.engine.claims import fast_claim
from service.engine.inputs import ready_claim
from service.engine.rates import (
    StepRate,
    _take,
    next_rate_wake,
    parks_for_rate,
    step_rate,
    wake_due_rates,
)
from service.engine.runner import run_step
from service.engine.runtime import Runtime
from service.engine.steps import Claimed, StepKey
from service.engine.submission import JobRequest, submit_job
from service.language.specs import RateLimitSpec
from service.platform.clock import utcnow
from service.platform.constants import NCBI_RATE_LIMIT_NAME, NCBI_RATE_WINDOW_S
from service.platform.constants import RATE_LEASE_PARTS as LEASE_PARTS
from service.platform.db import unit_of_work
from service.platform.models import JobRow, RateWaitRow, StepRunRow
from service.platform.ratelimit import KeyWindow, Room, redis_client
from service.platform.states import JOB_OPEN, JobStatus, StepStatus
from tests.support.arrange import walk
from tests.support.fanouts import submitted

LEASE_S = 30.0
OPEN = [status.value for status in JOB_OPEN]


def _profile(key: str, limit: int = 1) -> dict[str, object]:
    rate = {"key": "${{ params.source }}", "limit": limit, "per_s": 60}
    step = {"id": "call", "action": "noop", "rate_limit": rate}
    return {"name": "rated", "params": {"source": {"type": "string"}}, "steps": [step]}


def _claimed(rt: Runtime, job_id: uuid.UUID, now: datetime) -> Claimed:
    key = StepKey(job_id, "call")
    with rt.claims.connect() as conn:
        fast = fast_claim(conn, key, task_id="t", lease_s=LEASE_S, now=now)
    assert fast is not None
    claim = ready_claim(key, fast)
    assert claim is not None, "a rate-limited step is claimed as a plain one"
    return claim


def _row(rt: Runtime, job_id: uuid.UUID) -> StepRunRow:
    with unit_of_work(rt.sessions) as session:
        row = session.scalars(select(StepRunRow).where(StepRunRow.job_id == job_id)).one()
        session.expunge(row)
        return row


def _wait(rt: Runtime, job_id: uuid.UUID) -> RateWaitRow | None:
    with unit_of_work(rt.sessions) as session:
        row = session.get(RateWaitRow, (job_id, "call"))
        if row is not None:
            session.expunge(row)
        return row


@pytest.fixture
def source(runtime: Runtime) -> Iterator[str]:
    """A key of this test's own; its jobs end cancelled, as in the slots' tests."""
    yield f"src-{uuid.uuid4().hex[:8]}"
    with unit_of_work(runtime.sessions) as session:
        walk(session, JobRow, JobRow.status.in_(OPEN), to=JobStatus.CANCELLED)


def _client(rt: Runtime) -> redis.Redis:
    return redis_client(rt.settings.broker())


def test_a_step_over_its_keys_limit_parks_without_its_lease(runtime: Runtime, source: str) -> None:
    first = submitted(runtime, _profile(source), {"source": source})
    second = submitted(runtime, _profile(source), {"source": source})
    now = utcnow()

    assert not parks_for_rate(runtime, _claimed(runtime, first, now))
    assert parks_for_rate(runtime, _claimed(runtime, second, now))

    row = _row(runtime, second)
    assert row.status == StepStatus.AWAITING_RATE
    assert (row.lease_token, row.attempts, row.started_at) == (None, 0, None)
    wait = _wait(runtime, second)
    assert wait is not None and (wait.key, wait.units, wait.rate_limit) == (source, 1, 1)
    assert timedelta(seconds=59) < wait.wake_at - now <= timedelta(seconds=61)
    with unit_of_work(runtime.sessions) as session:
        assert next_rate_wake(session) is not None


def test_the_let_in_waits_for_the_window_then_sends_the_oldest_first(
    runtime: Runtime, source: str
) -> None:
    holder, *waiting = (submitted(runtime, _profile(source), {"source": source}) for _ in range(3))
    now = utcnow()
    assert not parks_for_rate(runtime, _claimed(runtime, holder, now))
    for job_id in waiting:
        assert parks_for_rate(runtime, _claimed(runtime, job_id, now))
    due = now + timedelta(seconds=61)

    with unit_of_work(runtime.sessions) as session:
        assert wake_due_rates(session, _client(runtime), now) == []
        assert wake_due_rates(session, _client(runtime), due) == []
    assert _row(runtime, waiting[0]).status == StepStatus.AWAITING_RATE, "the window is full"
    put_off = _wait(runtime, waiting[0])
    assert put_off is not None and put_off.wake_at > due, "due again when the window has room"

    _client(runtime).delete(f"flowbeat:ratelimit:key:{source}")
    due = put_off.wake_at
    with unit_of_work(runtime.sessions) as session:
        plans = wake_due_rates(session, _client(runtime), due)

    assert [(p.job_id, [s.step_id for s in p.steps]) for p in plans] == [(waiting[0], ["call"])]
    assert _row(runtime, waiting[0]).status == StepStatus.PENDING
    assert _wait(runtime, waiting[0]) is None
    later = _wait(runtime, waiting[1])
    assert later is not None and later.wake_at > due, "its turn is a window after the first's"


def test_the_ncbi_key_takes_its_limit_from_the_settings(runtime: Runtime) -> None:
    spec = RateLimitSpec(key=NCBI_RATE_LIMIT_NAME, limit=100)
    rate = step_rate(spec, {}, runtime.settings)
    assert rate.limit == runtime.settings.ncbi_rate_per_s
    assert rate.window_s == NCBI_RATE_WINDOW_S + runtime.settings.step_rate_guard_s


def test_a_step_whose_window_cannot_be_asked_gives_its_lease_back(
    runtime: Runtime, source: str
) -> None:
    job_id = submitted(runtime, _profile(source), {"source": source})
    unreachable = runtime.settings.model_copy(update={"broker_url": "redis://127.0.0.1:1/0"})

    with pytest.raises(redis.ConnectionError):
        run_step(replace(runtime, settings=unreachable), StepKey(job_id, "call"), task_id="t")

    row = _row(runtime, job_id)
    assert row.lease_token is None, "the next delivery need not wait for the lease to lapse"


def test_a_busy_process_leases_a_large_limit_for_a_moment_and_a_small_one_not_at_all(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Units leased are spent within half the start guard of their grant, or never."""
    asks: list[int] = []
    take = KeyWindow.take

    def counted(window: KeyWindow, units: int, member: str, extra: int = 0) -> Room:
        asks.append(units + extra)
        return take(window, units, member, extra)

    monkeypatch.setattr(KeyWindow, "take", counted)
    big = StepRate(f"big-{uuid.uuid4().hex[:8]}", 1000, 60.05, 1, "big")
    assert all(_take(big, f"m{n}", runtime.settings) is None for n in range(40))
    assert len(asks) < 10, "a busy process asked the window once for several steps"
    assert max(asks) <= 1000 // LEASE_PARTS

    asks.clear()
    small = StepRate(f"small-{uuid.uuid4().hex[:8]}", 5, 60.05, 1, "small")
    started = [_take(small, f"m{n}", runtime.settings) is None for n in range(6)]
    assert started == [True] * 5 + [False]
    assert asks == [1] * 6, "a limit under LEASE_PARTS is asked step by step"


def test_a_step_the_cache_answers_takes_no_unit_of_its_rate_limit(
    runtime: Runtime, source: str
) -> None:
    """The cache is asked before the window: a step it answers runs no action, so it neither
    spends the key's only unit nor parks for it."""
    profile = _profile(source)
    profile["steps"][0]["cache"] = {"ttl_s": 3600}  # type: ignore[index]
    owner = f"o-{uuid.uuid4().hex[:8]}"
    jobs = []
    for _ in range(2):
        with unit_of_work(runtime.sessions) as session:
            job, _ = submit_job(
                session,
                JobRequest(pipeline=profile, params={"source": source}),
                owner=owner,
                profiles_dir=runtime.settings.profiles_dir,
                known_actions=runtime.registry.names(),
            )
        run_step(runtime, StepKey(job.id, "call"), task_id=uuid.uuid4().hex)
        jobs.append(job.id)

    assert [_row(runtime, job_id).status for job_id in jobs] == [
        StepStatus.SUCCEEDED,
        StepStatus.CACHED,
    ]
    assert _wait(runtime, jobs[1]) is None
