"""Per-key and per-hook request limits, shared by every API process through the broker's Redis.

A key, or a hook taking deliveries without a key, may send ``rate_limit_burst`` requests in any
``burst / rate`` seconds: bursts up to the burst, ``rate`` per second on average. The limiter
is ``service.ratelimit``'s sliding window, so two API processes can never both grant the last
slot. If Redis cannot be reached the request goes on: the limit protects the service, and
refusing everything while Redis is down would be the outage it protects against (the routes
that need Redis answer 503 themselves).
"""

import logging
import math
import threading

import redis
from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from service.auth import Principal
from service.errors import RateLimited
from service.ratelimit import RateLimiter, redis_client
from service.settings import Settings

log = logging.getLogger(__name__)

_lock = threading.Lock()


def _limiter(app: FastAPI, settings: Settings, name: str) -> RateLimiter:
    with _lock:
        limiters: dict[str, RateLimiter] = app.state.key_limiters
        limiter = limiters.get(name)
        if limiter is None:
            limiter = _new_limiter(settings, name)
            limiters[name] = limiter
        return limiter


def _new_limiter(settings: Settings, name: str) -> RateLimiter:
    return RateLimiter(
        redis_client(settings.require_broker_url()),
        name,
        settings.rate_limit_burst,
        settings.rate_limit_burst / settings.rate_limit_per_s,
    )


def _take(limiter: RateLimiter) -> float | None:
    """Seconds to wait, or ``None`` when the request may go on."""
    try:
        granted, wait_s = limiter.try_acquire()
    except (redis.RedisError, OSError) as exc:
        log.warning("rate limit not checked, Redis unreachable: %s", exc)
        return None
    return None if granted else wait_s


async def _check(limiter: RateLimiter, settings: Settings, who: str) -> None:
    wait_s = await run_in_threadpool(_take, limiter)
    if wait_s is not None:
        raise RateLimited(
            f"more than {settings.rate_limit_burst} requests in "
            f"{settings.rate_limit_burst / settings.rate_limit_per_s:g} s {who}",
            {"retry_after_s": max(1, math.ceil(wait_s))},
        )


async def check_rate(app: FastAPI, settings: Settings, principal: Principal) -> None:
    if settings.rate_limit_per_s <= 0:
        return
    await _check(_limiter(app, settings, f"api-key:{principal.key_id}"), settings, "from this key")


async def check_hook_rate(settings: Settings, hook: str) -> None:
    """Counted before the signature is checked, so a flood of forged deliveries is limited
    too. The limiter is not cached: anyone can name a hook, and a cache would grow with them."""
    if settings.rate_limit_per_s <= 0:
        return
    await _check(_new_limiter(settings, f"hook:{hook}"), settings, "to this hook")
