"""Step rate limits: at most ``limit`` units of a key started in any window of ``per_s``
seconds, shared by every worker, job and owner that names the key (ADR 16).

A claimed step with a ``rate_limit`` asks its key's window in Redis for its units just before
its action runs (``parks_for_rate``): all of them or none, in one script call, on Redis's
clock. With room it runs at once; a step with no rate limit asks nothing, so the common path
costs not one statement more. A worker process that starts many steps of a key with a large
limit asks for several at once and spends them itself for a moment (``_Lease``): less than the
start guard after their grant, so the limit on starts holds as exactly as step by step.

With no room, the script answers when enough of the window's oldest grants leave it, and the
step parks ``awaiting_rate`` in one transaction (``park_for_rate``): it gives its lease back,
its attempt uncounted, and keeps its key, units and that time in ``rate_waits``, in
PostgreSQL. It holds no worker and no message.

The beat leader sleeps no later than the first ``wake_at`` and lets the due steps in then
(``wake_due_rates``), per key in the order they parked, as many as the window has room for
now; the next of the key is due when the window's present grants leave room for it beside
those just let in, or a window later if those fill it. Those let
in go back to ``pending`` and are sent; each asks the window again when it starts, so a
newcomer that took the room first only sends it back to wait, and the limit holds whoever
takes it. Nothing polls: every wait is computed from the window.

A Redis flush loses the windows, not the waiting steps: they are rows here, let in on time,
and the limit is permissive for at most one window while the windows fill again. A worker
killed while its step holds units leaks nothing: units are grant times, which leave the
window ``per_s`` after they were granted whatever becomes of the step.
"""

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from itertools import groupby

import redis
from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from service.catalogue.notices import record_event
from service.engine.runtime import Runtime
from service.engine.steps import Claimed
from service.language.expressions import CONCURRENCY_ROOTS, ExprContext, resolve
from service.language.plan import JobPlan, steps_plan
from service.language.snapshots import job_profile
from service.language.specs import RateLimitSpec
from service.platform import metrics
from service.platform.clock import utcnow
from service.platform.constants import (
    NCBI_RATE_LIMIT_NAME,
    NCBI_RATE_WINDOW_S,
    RATE_WAKE_BATCH,
    SCHEDULES_CHANNEL,
    STEP_RATE_KEY_PREFIX,
)
from service.platform.constants import (
    RATE_LEASE_PARTS as LEASE_PARTS,
)
from service.platform.db import unit_of_work
from service.platform.models import JobRow, RateWaitRow, StepRunRow
from service.platform.ratelimit import KeyWindow, Room, redis_client
from service.platform.settings import Settings
from service.platform.states import StepStatus


@dataclass(frozen=True)
class StepRate:
    """A step's rate limit with its key resolved: what its window is named and sized by."""

    key: str
    limit: int
    window_s: float
    units: int
    declared: str
    """The key as the profile writes it, before params resolve it: the metrics' label."""

    def window(self, client: redis.Redis) -> KeyWindow:
        return key_window(client, window_name(self.key), self.limit, self.window_s)


@lru_cache(maxsize=1024)
def key_window(client: redis.Redis, name: str, limit: int, window_s: float) -> KeyWindow:
    """One per key and process: registering its script costs as much as the call itself."""
    return KeyWindow(name, limit, window_s, client=client)


def configured(settings: Settings) -> dict[str, tuple[int, float]]:
    """Keys whose limit the deployment sets, not the step: the built-in NCBI limit, which the
    PubMed actions also take per request. A step naming one shares its window at its size."""
    ncbi = settings.ncbi_rate_per_s_with_key if settings.ncbi_api_key else settings.ncbi_rate_per_s
    return {NCBI_RATE_LIMIT_NAME: (ncbi, NCBI_RATE_WINDOW_S)}


def window_name(key: str) -> str:
    """Step keys live apart from the API's own limits; a configured key is its own name."""
    return key if key == NCBI_RATE_LIMIT_NAME else f"{STEP_RATE_KEY_PREFIX}{key}"


def step_rate(spec: RateLimitSpec, params: dict[str, object], settings: Settings) -> StepRate:
    key = spec.key
    if "${{" in key:
        key = str(resolve(key, ExprContext(params=params, outputs={}), CONCURRENCY_ROOTS))
    size = configured(settings).get(key, (spec.limit, float(spec.per_s)))
    return _sized(key, size, spec.units, spec.key, settings.step_rate_guard_s)


@lru_cache(maxsize=1024)
def _sized(
    key: str, size: tuple[int, float], units: int, declared: str, guard_s: float
) -> StepRate:
    """Made once per key and process: a step with room costs little more than its call."""
    limit, window_s = size
    return StepRate(key, limit, window_s + guard_s, min(units, limit), declared)


def parks_for_rate(rt: Runtime, claim: Claimed) -> bool:
    """Whether the claimed step, about to run, parks for its rate limit instead; a step with
    none answers at once, with no round trip."""
    spec = claim.profile.step(claim.key.step_id).rate_limit
    if spec is None:
        return False
    rate = step_rate(spec, claim.params, rt.settings)
    member = f"{claim.key.job_id}:{claim.key.step_id}:{claim.lease.attempt}"
    room = _take(rate, member, rt.settings)
    if room is None:
        metrics.RATE_LIMIT_STEPS.labels(rate.declared, "granted").inc()
        return False
    now = utcnow()
    with unit_of_work(rt.sessions) as session:
        park_for_rate(session, claim, rate, now + timedelta(seconds=room.wait_s), now)
    metrics.RATE_LIMIT_STEPS.labels(rate.declared, "parked").inc()
    return True


@dataclass
class _Lease:
    """Units of one grant that this process spends on its own steps of the key, each as it
    starts, until ``expires_at``: half the start guard after it asked. A unit is then spent
    less than the guard after its grant, which the window's length already allows for, so the
    limit on starts stays exact; what is unspent by then is wasted, never spent late."""

    granted: int
    spent: int
    expires_at: float
    size: int
    """The grants of a step's units it asked for; doubled when it was spent in time, halved
    when units were left, at most ``limit // LEASE_PARTS``: 1 for a limit under that."""

    def take(self, units: int, now: float) -> bool:
        if now >= self.expires_at or self.spent + units > self.granted:
            return False
        self.spent += units
        return True

    def next_size(self, units: int, cap: int) -> int:
        if self.spent + units > self.granted:
            return min(self.size * 2, cap)
        return max(1, self.size // 2)


_LEASES: dict[tuple[str, int, float], _Lease] = {}
_LEASES_LOCK = threading.Lock()


def _take(rate: StepRate, member: str, settings: Settings) -> Room | None:
    """``None`` when the step may start: a unit of this process's lease of the key, or a grant
    of the window; else the window's answer. A busy process asks the window once for several
    steps, so a limit that does not bind costs few round trips."""
    key = (rate.key, rate.limit, rate.window_s)
    asked_at = time.monotonic()
    with _LEASES_LOCK:
        lease = _LEASES.get(key)
        if lease is not None and lease.take(rate.units, asked_at):
            return None
        size = (
            1 if lease is None else lease.next_size(rate.units, max(1, rate.limit // LEASE_PARTS))
        )
    window = rate.window(redis_client(settings.broker()))
    room = window.take(rate.units, member, extra=(size - 1) * rate.units)
    if not room.granted:
        return room
    expires_at = asked_at + settings.step_rate_guard_s / 2
    with _LEASES_LOCK:
        _LEASES[key] = _Lease(room.granted, rate.units, expires_at, size)
    return None


def park_for_rate(
    session: Session, claim: Claimed, rate: StepRate, wake_at: datetime, now: datetime
) -> bool:
    """Park the step while this worker's lease still holds it; one whose lease was lost runs
    nothing here either. Its place in the key's line is kept from its first park."""
    key = claim.key
    parked = session.execute(
        update(StepRunRow)
        .where(
            StepRunRow.job_id == key.job_id,
            StepRunRow.step_id == key.step_id,
            StepRunRow.shard == key.shard,
            StepRunRow.status == StepStatus.RUNNING,
            StepRunRow.lease_token == claim.lease.token,
        )
        .values(
            status=StepStatus.AWAITING_RATE,
            attempts=StepRunRow.attempts - 1,
            lease_token=None,
            lease_until=None,
            started_at=None,
        )
        .returning(StepRunRow.job_id)
    ).first()
    if parked is None:
        return False
    wait = {
        "key": rate.key,
        "rate_limit": rate.limit,
        "window_s": rate.window_s,
        "units": rate.units,
        "wake_at": wake_at,
    }
    session.execute(
        insert(RateWaitRow)
        .values(job_id=key.job_id, step_id=key.step_id, parked_at=now, **wait)
        .on_conflict_do_update(index_elements=["job_id", "step_id"], set_=wait)
    )
    event = {"step_id": key.step_id, "key": rate.key, "wake_at": wake_at.isoformat()}
    record_event(session, key.job_id, StepStatus.AWAITING_RATE.value, event)
    session.execute(select(func.pg_notify(SCHEDULES_CHANNEL, "rate")))
    return True


def wake_due_rates(session: Session, client: redis.Redis, now: datetime) -> list[JobPlan]:
    """Let in the parked steps whose window is due to have room, per key oldest first and as
    many as it has room for now; the rest of a key are due again a window later, when what
    was just let in leaves it. The plans to send once the caller has committed."""
    due = session.scalars(
        select(RateWaitRow)
        .where(RateWaitRow.wake_at <= now)
        .order_by(RateWaitRow.key, RateWaitRow.parked_at)
        .limit(RATE_WAKE_BATCH)
        .with_for_update(skip_locked=True)
    ).all()
    let_in: list[RateWaitRow] = []
    for _, waits in groupby(due, key=lambda wait: wait.key):
        let_in += _let_in_key(session, client, list(waits), now)
    if not let_in:
        return []
    woken = session.execute(
        update(StepRunRow)
        .where(
            func.row(StepRunRow.job_id, StepRunRow.step_id).in_(
                [func.row(wait.job_id, wait.step_id) for wait in let_in]
            ),
            StepRunRow.shard == -1,
            StepRunRow.status == StepStatus.AWAITING_RATE,
        )
        .values(status=StepStatus.PENDING)
        .returning(StepRunRow.job_id, StepRunRow.step_id)
    ).all()
    for wait in let_in:
        session.delete(wait)
    return list(_plans(session, [(job_id, step_id) for job_id, step_id in woken]))


def _let_in_key(
    session: Session, client: redis.Redis, waits: list[RateWaitRow], now: datetime
) -> list[RateWaitRow]:
    first = waits[0]
    window = key_window(client, window_name(first.key), first.rate_limit, first.window_s)
    room = window.look(first.units)
    free = 0 if room.wait_s > 0 else first.rate_limit - room.used
    taken = 0
    for index, wait in enumerate(waits):
        if taken + wait.units > free:
            again = now + timedelta(seconds=_next_turn(window, room, taken, wait))
            rest = [(w.job_id, w.step_id) for w in waits[index:]]
            session.execute(
                update(RateWaitRow)
                .where(func.row(RateWaitRow.job_id, RateWaitRow.step_id).in_(rest))
                .values(wake_at=again)
            )
            return waits[:index]
        taken += wait.units
    return waits


def _next_turn(window: KeyWindow, room: Room, taken: int, next_up: RateWaitRow) -> float:
    """Seconds until the window has room for the next waiting step, once the steps just let
    in have taken theirs: when enough of its present grants leave it, or, if those steps fill
    it, a window from now, by when their own grants leave."""
    if taken == 0:
        return room.wait_s
    if taken + next_up.units <= window.limit:
        return window.look(taken + next_up.units).wait_s
    return window.window_s


def _plans(session: Session, woken: list[tuple[uuid.UUID, str]]) -> Iterator[JobPlan]:
    by_job: dict[uuid.UUID, list[str]] = {}
    for job_id, step_id in woken:
        by_job.setdefault(job_id, []).append(step_id)
    for job_id, step_ids in by_job.items():
        job = session.get(JobRow, job_id)
        if job is not None:
            yield steps_plan(job_profile(job), job_id, step_ids).at(job.priority)


def next_rate_wake(session: Session) -> datetime | None:
    """The earliest time a parked step's window is due to have room, for the leader's sleep."""
    value: datetime | None = session.scalar(select(func.min(RateWaitRow.wake_at)))
    return value
