"""A rate limit shared by every process of a deployment, kept in the broker's Redis.

Workers run on many machines, so a per-process limiter would multiply the rate by the number of
processes; NCBI blocks clients that go over 3 (or 10 with a key) requests per second. The limit
is a sliding-window log: a sorted set of grant times, trimmed and checked in one Lua script so
that two processes can never both take the last slot. Time comes from Redis itself, so clocks of
different machines do not matter. ``acquire`` blocks until a slot is free. A grant may take
several units at once (``service.platform.ratelease``): each is a member of its own, so the
window counts units, whoever took them.
"""

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import redis
import redis.asyncio
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from service.platform import brokers
from service.platform.brokers import BrokerAddress
from service.platform.constants import RATE_LIMIT_KEY_PREFIX

_ACQUIRE = """
local key = KEYS[1]
local limit = tonumber(ARGV[1])
local window_us = tonumber(ARGV[2])
local member = ARGV[3]
local wanted = tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window_us)
local room = limit - redis.call('ZCARD', key)
if room > 0 then
  local granted = math.min(wanted, room)
  local added = {}
  for i = 1, granted do
    added[2 * i - 1] = now
    added[2 * i] = member .. ':' .. i
  end
  redis.call('ZADD', key, unpack(added))
  redis.call('PEXPIRE', key, math.ceil(window_us / 1000) + 1000)
  return {granted, now}
end
local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
return {0, tonumber(oldest[2]) + window_us - now + 1}
"""


@lru_cache(maxsize=8)
def redis_client(broker: BrokerAddress | str) -> redis.Redis:
    """One connection pool per Redis and process, shared by every limiter."""
    return brokers.redis_client(broker)


@dataclass
class _Window:
    """At most ``limit`` grants in any window of ``window_s`` seconds, across all processes."""

    name: str
    limit: int
    window_s: float = 1.0

    def __post_init__(self) -> None:
        if self.limit < 1 or self.window_s <= 0:
            raise ValueError("a rate limit needs limit >= 1 and a positive window")

    @property
    def key(self) -> str:
        return f"{RATE_LIMIT_KEY_PREFIX}{self.name}"

    def _args(self, units: int = 1, member: str | None = None) -> list[int | str]:
        return [self.limit, int(self.window_s * 1_000_000), member or uuid.uuid4().hex, units]


def unit_members(member: str, first: int, last: int) -> list[str]:
    """The window's members for units ``first`` to ``last`` (from 1) of the grant ``member``."""
    return [f"{member}:{unit}" for unit in range(first, last + 1)]


def _answer(reply: object) -> tuple[int, float]:
    """``(units granted, grant time in s on the Redis clock)`` or ``(0, seconds to wait)``."""
    assert isinstance(reply, list)
    granted, value = reply
    return int(granted), int(value) / 1_000_000


@dataclass
class RateLimiter(_Window):
    """The limit for threads: a step that calls a rate-limited service waits for its slot."""

    client: redis.Redis = field(kw_only=True)
    _script: Callable[..., object] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._script = self.client.register_script(_ACQUIRE)

    def try_acquire(self) -> tuple[bool, float]:
        granted, value = _answer(self._script(keys=[self.key], args=self._args()))
        return granted > 0, value

    def acquire(
        self, sleep: Callable[[float], None] = time.sleep, timeout_s: float = 60.0
    ) -> float:
        """Wait for a slot and return its grant time; ``sleep`` lets a step stay cancellable."""
        deadline = time.monotonic() + timeout_s
        while True:
            granted, value = self.try_acquire()
            if granted:
                return value
            if time.monotonic() + value > deadline:
                raise TimeoutError(f"rate limit {self.name!r}: no slot within {timeout_s}s")
            sleep(value)


@dataclass
class AsyncRateLimiter(_Window):
    """The limit for an event loop: the API checks every request's key without a thread.

    Its client belongs to the loop that opened it, as every ``redis.asyncio`` client does."""

    client: redis.asyncio.Redis = field(kw_only=True)
    _script: AsyncScript = field(init=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._script = self.client.register_script(_ACQUIRE)

    async def try_take(self, units: int, member: str) -> tuple[int, float]:
        """Up to ``units`` of the window, named after ``member``: ``(units granted, grant time)``,
        or ``(0, seconds to wait)`` when the window is full."""
        return _answer(await self._script(keys=[self.key], args=self._args(units, member)))


@dataclass(frozen=True)
class Ask:
    """``units`` of ``limiter``'s window, named after ``member`` so that they can be returned."""

    limiter: AsyncRateLimiter
    units: int = 1
    member: str = field(default_factory=lambda: uuid.uuid4().hex)


async def try_acquire_all(
    client: redis.asyncio.Redis, asks: Sequence[Ask]
) -> list[tuple[int, float] | BaseException]:
    """``try_take`` of each ask, in one round trip. A limiter whose script Redis does not hold
    (it restarted) asks again on its own, which loads the script: a reply of ``NOSCRIPT``
    means nothing ran."""
    pipe = client.pipeline(transaction=False)
    for ask in asks:
        limiter = ask.limiter
        pipe.evalsha(limiter._script.sha, 1, limiter.key, *limiter._args(ask.units, ask.member))
    replies = await pipe.execute(raise_on_error=False)
    answers: list[tuple[int, float] | BaseException] = []
    for ask, reply in zip(asks, replies, strict=True):
        if isinstance(reply, NoScriptError):
            try:
                answers.append(await ask.limiter.try_take(ask.units, ask.member))
            except redis.RedisError as exc:
                answers.append(exc)
        elif isinstance(reply, BaseException):
            answers.append(reply)
        else:
            answers.append(_answer(reply))
    return answers
