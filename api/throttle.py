"""Per-key and per-hook request limits, shared by every API process through the broker's Redis.

A key, or a hook taking deliveries without a key, may send ``rate_limit_burst`` requests in any
``burst / rate`` seconds: bursts up to the burst, ``rate`` per second on average. The limiter
is ``service.platform.ratelimit``'s sliding window, so two API processes can never both grant
the last slot. It runs on the event loop: through the thread pool, the check queued every request
behind the pool's other work, and at 500 requests a second cost more than the request itself.
Checks that queue up while one is in flight go to Redis together, in one round trip.
If Redis cannot be reached in ``RATE_LIMIT_REDIS_TIMEOUT_S`` the request goes on: the limit
protects the service, and refusing everything while Redis is down would be the outage it
protects against (the routes that need Redis answer 503 themselves).
"""

import logging
import math
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import redis
import redis.asyncio
from fastapi import FastAPI

from api.batching import Coalescer
from service.platform.auth import Principal
from service.platform.brokers import async_redis_client
from service.platform.constants import RATE_LIMIT_BATCH_MAX, RATE_LIMIT_REDIS_TIMEOUT_S
from service.platform.errors import RateLimited
from service.platform.ratelimit import AsyncRateLimiter, try_acquire_all
from service.platform.settings import Settings

log = logging.getLogger(__name__)


class Throttle:
    """The limits of one app, on the event loop whose Redis connections it holds."""

    def __init__(self, settings: Settings, client: redis.asyncio.Redis) -> None:
        self.settings = settings
        self.client = client
        self._keys: dict[str, AsyncRateLimiter] = {}
        self._checks: Coalescer[AsyncRateLimiter, tuple[bool, float]] = Coalescer(
            self._check_all, RATE_LIMIT_BATCH_MAX
        )

    async def _check_all(
        self, limiters: Sequence[AsyncRateLimiter]
    ) -> list[tuple[bool, float] | BaseException]:
        return await try_acquire_all(self.client, limiters)

    def limiter(self, name: str) -> AsyncRateLimiter:
        return AsyncRateLimiter(
            name,
            self.settings.rate_limit_burst,
            self.settings.rate_limit_burst / self.settings.rate_limit_per_s,
            client=self.client,
        )

    def for_key(self, key_id: uuid.UUID) -> AsyncRateLimiter:
        """Kept per key, as only authenticated keys reach here and their number is bounded."""
        name = f"api-key:{key_id}"
        limiter = self._keys.get(name)
        if limiter is None:
            limiter = self._keys[name] = self.limiter(name)
        return limiter

    async def check(self, limiter: AsyncRateLimiter, who: str) -> None:
        try:
            granted, wait_s = await self._checks.submit(limiter)
        except (redis.RedisError, OSError) as exc:
            log.warning("rate limit not checked, Redis unreachable: %s", exc)
            return
        if not granted:
            raise RateLimited(
                f"more than {limiter.limit} requests in {limiter.window_s:g} s {who}",
                {"retry_after_s": max(1, math.ceil(wait_s))},
            )


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
        yield Throttle(settings, client)
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
        await limits.check(limits.for_key(principal.key_id), "from this key")


async def check_hook_rate(app: FastAPI, hook: str) -> None:
    """Counted before the signature is checked, so a flood of forged deliveries is limited
    too. The limiter is not cached: anyone can name a hook, and a cache would grow with them."""
    limits = _throttle(app)
    if limits is not None:
        await limits.check(limits.limiter(f"hook:{hook}"), "to this hook")
