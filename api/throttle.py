"""Per-key and per-hook request limits, shared by every API process through the broker's Redis.

A key, or a hook taking deliveries without a key, may send ``rate_limit_burst`` requests in any
``burst / rate`` seconds: bursts up to the burst, ``rate`` per second on average. The limiter
is ``service.platform.ratelimit``'s sliding window, shared by every API process. A key's
requests spend a lease of ``rate_limit_lease`` units of it that the process takes at a time
(``service.platform.ratelease``, which states the tolerance that buys): at 500 requests a
second the round trip to Redis was most of what the limit cost a request. A hook's deliveries
take one unit each, as anyone can name a hook and a lease kept for each would grow with them.
It runs on the event loop: through the thread pool, the check queued every request behind the
pool's other work. Asks that queue up while one is in flight go to Redis together, in one round
trip.
If Redis cannot be reached in ``RATE_LIMIT_REDIS_TIMEOUT_S`` the request goes on: the limit
protects the service, and refusing everything while Redis is down would be the outage it
protects against (the routes that need Redis answer 503 themselves).
"""

import logging
import math
import uuid
from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import asynccontextmanager

import redis
import redis.asyncio
from fastapi import FastAPI

from api.batching import Coalescer
from service.platform.auth import Principal
from service.platform.brokers import async_redis_client
from service.platform.constants import (
    RATE_LIMIT_BATCH_MAX,
    RATE_LIMIT_LEASE_PARTS,
    RATE_LIMIT_REDIS_TIMEOUT_S,
)
from service.platform.errors import RateLimited
from service.platform.ratelease import LeasedLimit
from service.platform.ratelimit import Ask, AsyncRateLimiter, try_acquire_all
from service.platform.settings import Settings

log = logging.getLogger(__name__)


class Throttle:
    """The limits of one app, on the event loop whose Redis connections it holds."""

    def __init__(self, settings: Settings, client: redis.asyncio.Redis) -> None:
        self.settings = settings
        self.client = client
        self._keys: dict[str, LeasedLimit] = {}
        self._asks: Coalescer[Ask, tuple[int, float]] = Coalescer(
            self._ask_all, RATE_LIMIT_BATCH_MAX
        )

    async def _ask_all(self, asks: Sequence[Ask]) -> list[tuple[int, float] | BaseException]:
        return await try_acquire_all(self.client, asks)

    def lease_units(self) -> int:
        """A lease is at most a ``RATE_LIMIT_LEASE_PARTS``-th of the burst, so that a small
        limit stays exact (one unit) unless its lease is set for it."""
        burst = self.settings.rate_limit_burst
        return max(1, min(self.settings.rate_limit_lease, burst // RATE_LIMIT_LEASE_PARTS))

    def limiter(self, name: str) -> AsyncRateLimiter:
        return AsyncRateLimiter(
            name,
            self.settings.rate_limit_burst,
            self.settings.rate_limit_burst / self.settings.rate_limit_per_s,
            client=self.client,
        )

    def for_key(self, key_id: uuid.UUID) -> LeasedLimit:
        """Kept per key, as only authenticated keys reach here and their number is bounded."""
        name = f"api-key:{key_id}"
        limit = self._keys.get(name)
        if limit is None:
            limit = self._keys[name] = LeasedLimit(
                self.limiter(name), self.lease_units(), self._asks.submit
            )
        return limit

    async def check(self, limiter: AsyncRateLimiter, who: str) -> None:
        await self._checked(limiter, self._one_unit(limiter), who)

    async def check_leased(self, limit: LeasedLimit, who: str) -> None:
        await self._checked(limit.limiter, limit.acquire(), who)

    async def _one_unit(self, limiter: AsyncRateLimiter) -> tuple[bool, float]:
        granted, value = await self._asks.submit(Ask(limiter))
        return granted > 0, value

    async def _checked(
        self, limiter: AsyncRateLimiter, answer: Awaitable[tuple[bool, float]], who: str
    ) -> None:
        try:
            granted, wait_s = await answer
        except (redis.RedisError, OSError) as exc:
            log.warning("rate limit not checked, Redis unreachable: %s", exc)
            return
        if not granted:
            raise RateLimited(
                f"more than {limiter.limit} requests in {limiter.window_s:g} s {who}",
                {"retry_after_s": max(1, math.ceil(wait_s))},
            )

    async def give_back(self) -> None:
        """Returns the units no request used, so that a process stopping (a rolling restart)
        does not leave them counted against its keys until their window passes."""
        pipe = self.client.pipeline(transaction=False)
        for limit in self._keys.values():
            unspent = limit.unspent()
            if unspent:
                pipe.zrem(limit.limiter.key, *unspent)
        try:
            await pipe.execute()
        except (redis.RedisError, OSError) as exc:
            log.warning("unspent rate-limit units not returned, Redis unreachable: %s", exc)


@asynccontextmanager
async def throttle(settings: Settings) -> AsyncIterator[Throttle | None]:
    """The app's limits for its lifespan; ``None`` when the settings turn them off."""
    if settings.rate_limit_per_s <= 0:
        yield None
        return
    client = async_redis_client(
        settings.broker(),
        socket_connect_timeout=RATE_LIMIT_REDIS_TIMEOUT_S,
        socket_timeout=RATE_LIMIT_REDIS_TIMEOUT_S,
    )
    try:
        limits = Throttle(settings, client)
        yield limits
        await limits.give_back()
    finally:
        await client.aclose()


def _throttle(app: FastAPI) -> Throttle | None:
    found: Throttle | None = app.state.throttle
    if found is None and app.state.settings.rate_limit_per_s > 0:
        raise RuntimeError("rate limits are on but the app's lifespan has not started them")
    return found


async def check_rate(app: FastAPI, principal: Principal) -> None:
    limits = _throttle(app)
    if limits is not None:
        await limits.check_leased(limits.for_key(principal.key_id), "from this key")


async def check_hook_rate(app: FastAPI, hook: str) -> None:
    """Counted before the signature is checked, so a flood of forged deliveries is limited
    too. The limiter is not cached: anyone can name a hook, and a cache would grow with them."""
    limits = _throttle(app)
    if limits is not None:
        await limits.check(limits.limiter(f"hook:{hook}"), "to this hook")
