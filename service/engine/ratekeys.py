"""What each step rate-limit key is doing now, for ``GET /v1/rate-limits``, the CLI and the
dashboard: its limit, the units its window holds, the steps parked for it and when the first
of them is due.

A key is listed while its window lives in Redis (a grant less than a window old), while a
step waits for it in PostgreSQL, or when the settings configure it (the NCBI limit). Its use
is read, never taken: the window's grants younger than a window on Redis's clock. The waiting
steps listed are those of the jobs the caller may see; their count is every owner's, since
the key is shared by all of them.
"""

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

import redis
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.engine.rates import configured, window_name
from service.platform.constants import (
    RATE_LIMIT_KEY_PREFIX,
    RATE_LIMIT_META_PREFIX,
    STEP_RATE_KEY_PREFIX,
)
from service.platform.models import JobRow, RateWaitRow, StepRunRow
from service.platform.settings import Settings
from service.platform.states import StepStatus

WAITING_LISTED = 20
"""Most waiting steps shown per key: the oldest, the next to be let in."""


@dataclass(frozen=True)
class WaitingStep:
    job_id: str
    step_id: str
    parked_at: datetime
    wake_at: datetime


@dataclass
class RateKeyUse:
    key: str
    limit: int
    window_s: float
    used: int = 0
    waiting: int = 0
    next_wake_at: datetime | None = None
    configured: bool = False
    steps: list[WaitingStep] = field(default_factory=list)


def rate_keys(
    session: Session, client: redis.Redis, settings: Settings, owner: str | None
) -> list[RateKeyUse]:
    """Every key in use, waited for or configured, by name; the waiting steps listed are
    ``owner``'s (every owner's for ``None``)."""
    keys = {
        name: RateKeyUse(name, limit, window_s, configured=True)
        for name, (limit, window_s) in configured(settings).items()
    }
    for name, (limit, window_s) in _live_windows(client).items():
        keys.setdefault(name, RateKeyUse(name, limit, window_s))
    _add_waiting(session, keys, owner)
    _add_use(client, keys)
    return sorted(keys.values(), key=lambda use: use.key)


def _live_windows(client: redis.Redis) -> dict[str, tuple[int, float]]:
    names = [raw.decode() for raw in client.scan_iter(match=f"{RATE_LIMIT_META_PREFIX}*")]
    metas = client.mget(names) if names else []
    live = {}
    for name, meta in zip(names, metas, strict=True):
        if meta is None:
            continue
        limit, window_us = meta.split()
        window = name.removeprefix(RATE_LIMIT_META_PREFIX)
        live[window.removeprefix(STEP_RATE_KEY_PREFIX)] = (int(limit), int(window_us) / 1e6)
    return live


def _add_waiting(session: Session, keys: dict[str, RateKeyUse], owner: str | None) -> None:
    parked = (
        select(RateWaitRow, JobRow.owner)
        .join(
            StepRunRow,
            (StepRunRow.job_id == RateWaitRow.job_id)
            & (StepRunRow.step_id == RateWaitRow.step_id)
            & (StepRunRow.shard == -1),
        )
        .join(JobRow, JobRow.id == RateWaitRow.job_id)
        .where(StepRunRow.status == StepStatus.AWAITING_RATE)
        .order_by(RateWaitRow.key, RateWaitRow.parked_at)
    )
    counted: dict[str, int] = defaultdict(int)
    for wait, job_owner in session.execute(parked):
        use = keys.setdefault(wait.key, RateKeyUse(wait.key, wait.rate_limit, wait.window_s))
        counted[wait.key] += 1
        if use.next_wake_at is None or wait.wake_at < use.next_wake_at:
            use.next_wake_at = wait.wake_at
        if len(use.steps) < WAITING_LISTED and owner in (None, job_owner):
            step = WaitingStep(str(wait.job_id), wait.step_id, wait.parked_at, wait.wake_at)
            use.steps.append(step)
    for key, count in counted.items():
        keys[key].waiting = count


def _add_use(client: redis.Redis, keys: dict[str, RateKeyUse]) -> None:
    seconds, micros = client.time()
    now = seconds + micros / 1e6
    uses = list(keys.values())
    with client.pipeline(transaction=False) as pipe:
        for use in uses:
            pipe.zcount(
                f"{RATE_LIMIT_KEY_PREFIX}{window_name(use.key)}",
                int((now - use.window_s) * 1e6),
                "+inf",
            )
        counts = pipe.execute()
    for use, count in zip(uses, counts, strict=True):
        use.used = int(count)
