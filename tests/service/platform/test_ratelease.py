"""A process's lease of a shared window's units, counted on the real Redis."""

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis
import redis.asyncio

from service.platform.ratelease import LeasedLimit
from service.platform.ratelimit import Ask, AsyncRateLimiter
from tests.conftest import Stack

T = TypeVar("T")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Process:
    """One API process's view of a key: its own lease, the asks it sent to Redis."""

    def __init__(
        self, client: redis.asyncio.Redis, name: str, limit: int, units: int, clock: Clock
    ) -> None:
        self.asks: list[Ask] = []
        self.limit = LeasedLimit(
            AsyncRateLimiter(name, limit, 60.0, client=client), units, self._send, clock
        )

    async def _send(self, ask: Ask) -> tuple[int, float]:
        self.asks.append(ask)
        return await ask.limiter.try_take(ask.units, ask.member)

    async def requests(self, n: int) -> list[bool]:
        return [granted for granted, _ in [await self.limit.acquire() for _ in range(n)]]


def _with_redis(stack: Stack, body: Callable[[redis.asyncio.Redis], Awaitable[T]]) -> T:
    async def run() -> T:
        client = redis.asyncio.Redis.from_url(stack.broker_url)
        try:
            return await body(client)
        finally:
            await client.aclose()

    return asyncio.run(run())


def _counted(stack: Stack, limit: LeasedLimit) -> int:
    return int(redis.Redis.from_url(stack.broker_url).zcard(limit.limiter.key))


def _name() -> str:
    return f"t-{uuid.uuid4().hex}"


def test_a_lease_takes_its_units_in_one_ask_and_serves_them_without_another(
    stack: Stack,
) -> None:
    async def body(client: redis.asyncio.Redis) -> tuple[Process, list[bool]]:
        process = Process(client, _name(), 20, 5, Clock())
        return process, await process.requests(5)

    process, granted = _with_redis(stack, body)

    assert granted == [True] * 5
    assert len(process.asks) == 1
    assert _counted(stack, process.limit) == 5


def test_a_burst_that_outnumbers_the_lease_asks_once_more_for_what_it_lacks(
    stack: Stack,
) -> None:
    async def body(client: redis.asyncio.Redis) -> tuple[Process, list[tuple[bool, float]]]:
        process = Process(client, _name(), 20, 1, Clock())
        answers = await asyncio.gather(*(process.limit.acquire() for _ in range(8)))
        return process, list(answers)

    process, answers = _with_redis(stack, body)

    assert [granted for granted, _ in answers] == [True] * 8
    assert [ask.units for ask in process.asks] == [1, 7]
    assert process.limit.lease is not None and process.limit.lease.unspent(1000.0) == []


def test_requests_waiting_on_a_renewal_share_one_ask(stack: Stack) -> None:
    async def body(client: redis.asyncio.Redis) -> tuple[Process, list[tuple[bool, float]]]:
        process = Process(client, _name(), 20, 4, Clock())
        answers = await asyncio.gather(*(process.limit.acquire() for _ in range(8)))
        return process, list(answers)

    process, answers = _with_redis(stack, body)

    assert [granted for granted, _ in answers] == [True] * 8
    assert len(process.asks) == 2
    assert _counted(stack, process.limit) == 8


def test_processes_sharing_a_window_get_no_more_than_its_limit_and_the_last_lease_is_partial(
    stack: Stack,
) -> None:
    name = _name()

    async def body(client: redis.asyncio.Redis) -> tuple[Process, list[bool]]:
        clock = Clock()
        first, second = (Process(client, name, 10, 4, clock) for _ in range(2))
        granted = await first.requests(4) + await second.requests(4) + await first.requests(4)
        return first, granted + await second.requests(1)

    first, granted = _with_redis(stack, body)

    assert granted == [True] * 10 + [False] * 3
    assert first.limit.lease is not None and first.limit.lease.granted == 2
    assert redis.Redis.from_url(stack.broker_url).zcard(first.limit.limiter.key) == 10


def test_a_full_window_refuses_with_the_time_until_its_oldest_unit_leaves(stack: Stack) -> None:
    async def body(client: redis.asyncio.Redis) -> tuple[bool, float]:
        process = Process(client, _name(), 3, 3, Clock())
        await process.requests(3)
        return await process.limit.acquire()

    granted, wait_s = _with_redis(stack, body)

    assert not granted
    assert 59.0 < wait_s <= 60.0


def test_a_lease_is_not_spent_once_its_window_has_passed(stack: Stack) -> None:
    async def body(client: redis.asyncio.Redis) -> Process:
        clock = Clock()
        process = Process(client, _name(), 20, 5, clock)
        await process.requests(1)
        clock.now += 60.0
        await process.requests(1)
        return process

    process = _with_redis(stack, body)

    assert len(process.asks) == 2
    assert process.limit.lease is not None and process.limit.lease.spent == 1


def test_the_unspent_units_of_a_lease_are_the_ones_to_give_back(stack: Stack) -> None:
    async def body(client: redis.asyncio.Redis) -> Process:
        process = Process(client, _name(), 20, 5, Clock())
        await process.requests(2)
        await client.zrem(process.limit.limiter.key, *process.limit.unspent())
        return process

    process = _with_redis(stack, body)

    assert _counted(stack, process.limit) == 2


def test_a_lease_of_one_unit_asks_for_every_request(stack: Stack) -> None:
    async def body(client: redis.asyncio.Redis) -> Process:
        process = Process(client, _name(), 20, 1, Clock())
        await process.requests(3)
        return process

    process = _with_redis(stack, body)

    assert len(process.asks) == 3
