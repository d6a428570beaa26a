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
from service.platform.constants import RATE_LIMIT_KEY_PREFIX, RATE_LIMIT_META_PREFIX

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


_TAKE_ALL = """
local key = KEYS[1]
local limit = tonumber(ARGV[1])
local window_us = tonumber(ARGV[2])
local member = ARGV[3]
local units = tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local ttl = math.ceil(window_us / 1000) + 1000
redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window_us)
local used = redis.call('ZCARD', key)
redis.call('SET', KEYS[2], limit .. ' ' .. window_us, 'PX', ttl)
if ARGV[5] == '1' and used + units <= limit then
  units = units + math.min(tonumber(ARGV[6]), limit - used - units)
  local added = {}
  for i = 1, units do
    added[2 * i - 1] = now
    added[2 * i] = member .. ':' .. i
  end
  redis.call('ZADD', key, unpack(added))
  redis.call('PEXPIRE', key, ttl)
  return {units, now, used + units}
end
if used + units <= limit then
  return {0, 0, used}
end
local gone = used + units - limit - 1
local nth = redis.call('ZRANGE', key, gone, gone, 'WITHSCORES')
return {0, tonumber(nth[2]) + window_us - now + 1, used}
"""
"""All of ``units`` or none, unlike ``_ACQUIRE``: a step that takes three units of a call
starts only when the window holds three; with them it takes up to ``ARGV[6]`` more if there
is room, for a short lease (``service.engine.rates``). With no room, the wait is until enough
of the oldest grants have left the window, which is exact while nobody else takes the room
first. With ``ARGV[5]`` not ``1`` it only looks (the beat's let-in). The limit and window are
kept beside the window, for as long as it lives, for whoever lists the keys in use."""


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


@dataclass(frozen=True)
class Room:
    """A key's window as one call found it: whether it granted, the units it now holds, and
    when it next has room for the units asked (0 when it has room now)."""

    granted: int
    """Units granted: none, or those asked and as many of the extra as there was room for."""
    used: int
    wait_s: float


@dataclass
class KeyWindow(_Window):
    """A step rate limit's window: all of a step's units or none, never blocking; a step that
    finds no room parks until ``wait_s`` has passed (``service.engine.rates``)."""

    client: redis.Redis = field(kw_only=True)
    _script: Callable[..., object] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._script = self.client.register_script(_TAKE_ALL)

    @property
    def meta_key(self) -> str:
        return f"{RATE_LIMIT_META_PREFIX}{self.name}"

    def take(self, units: int, member: str, extra: int = 0) -> Room:
        return self._call(units, member, "1", extra)

    def look(self, units: int) -> Room:
        """Whether ``units`` would fit now, taking nothing."""
        return self._call(units, "", "0", 0)

    def _call(self, units: int, member: str, take: str, extra: int) -> Room:
        args = [*self._args(units, member), take, extra]
        reply = self._script(keys=[self.key, self.meta_key], args=args)
        assert isinstance(reply, list)
        granted, wait_us, used = (int(value) for value in reply)
        return Room(granted, used, 0.0 if granted else wait_us / 1_000_000)
