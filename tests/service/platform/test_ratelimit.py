"""The shared rate limit holds across threads and processes, on the real Redis."""

import asyncio
import multiprocessing
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
import redis.asyncio

from service.platform.constants import RATE_LIMIT_KEY_PREFIX
from service.platform.ratelimit import (
    Ask,
    AsyncRateLimiter,
    KeyWindow,
    RateLimiter,
    try_acquire_all,
)
from tests.conftest import Stack

LIMIT = 5
GRANTS_PER_THREAD = 3
THREADS = 2
PROCESSES = 3


def _grants(url: str, name: str, out: "multiprocessing.Queue[list[float]]") -> None:
    limiter = RateLimiter(name, LIMIT, client=redis.Redis.from_url(url))
    with ThreadPoolExecutor(THREADS) as pool:
        batches = pool.map(
            lambda _: [limiter.acquire(timeout_s=30) for _ in range(GRANTS_PER_THREAD)],
            range(THREADS),
        )
        out.put([t for batch in batches for t in batch])


def assert_no_window_exceeds(times: list[float], limit: int, window_s: float) -> None:
    ordered = sorted(times)
    for first, later in zip(ordered, ordered[limit:], strict=False):
        assert later - first >= window_s, f"{limit + 1} grants within {later - first:.3f}s"


@pytest.mark.e2e  # spawns processes that share the limit
def test_no_one_second_window_exceeds_the_limit_across_processes(stack: Stack) -> None:
    name = f"test-{uuid.uuid4().hex[:8]}"
    context = multiprocessing.get_context("spawn")
    queue: multiprocessing.Queue[list[float]] = context.Queue()
    procs = [
        context.Process(target=_grants, args=(stack.broker_url, name, queue))
        for _ in range(PROCESSES)
    ]
    for proc in procs:
        proc.start()
    times = [t for _ in procs for t in queue.get(timeout=60)]
    for proc in procs:
        proc.join(timeout=10)

    assert len(times) == PROCESSES * THREADS * GRANTS_PER_THREAD
    assert_no_window_exceeds(times, LIMIT, 1.0)
    expected_span = len(times) / LIMIT - 1
    assert expected_span <= max(times) - min(times) < expected_span + 2


def test_a_full_window_says_how_long_to_wait(stack: Stack) -> None:
    limiter = RateLimiter(f"t-{uuid.uuid4().hex}", 2, client=redis.Redis.from_url(stack.broker_url))
    assert limiter.try_acquire()[0]
    assert limiter.try_acquire()[0]
    granted, wait_s = limiter.try_acquire()
    assert not granted
    assert 0 < wait_s <= 1.0


def test_acquire_gives_up_after_its_timeout(stack: Stack) -> None:
    limiter = RateLimiter(
        f"t-{uuid.uuid4().hex}", 1, 60, client=redis.Redis.from_url(stack.broker_url)
    )
    limiter.acquire()
    with pytest.raises(TimeoutError):
        limiter.acquire(timeout_s=0.2)


def test_a_limit_below_one_is_refused(stack: Stack) -> None:
    with pytest.raises(ValueError):
        RateLimiter("x", 0, client=redis.Redis.from_url(stack.broker_url))


def test_the_event_loop_limiter_shares_the_window_of_the_threads_one(stack: Stack) -> None:
    """A window of a minute: a stall of the machine between the two limiters' grants must not
    let the first grant age out of it."""
    name = f"t-{uuid.uuid4().hex}"
    threads = RateLimiter(name, 2, 60, client=redis.Redis.from_url(stack.broker_url))
    assert threads.try_acquire()[0]

    async def twice() -> list[tuple[int, float]]:
        client = redis.asyncio.Redis.from_url(stack.broker_url)
        try:
            loop = AsyncRateLimiter(name, 2, 60, client=client)
            return [await loop.try_take(1, "a"), await loop.try_take(1, "b")]
        finally:
            await client.aclose()

    [(first, _), (second, wait_s)] = asyncio.run(twice())

    assert first and not second
    assert 0 < wait_s <= 60.0


def test_checks_sent_together_are_granted_in_order_in_one_window(stack: Stack) -> None:
    shared, alone = f"t-{uuid.uuid4().hex}", f"t-{uuid.uuid4().hex}"

    async def together() -> list[tuple[int, float] | BaseException]:
        client = redis.asyncio.Redis.from_url(stack.broker_url)
        try:
            asks = [Ask(AsyncRateLimiter(shared, 2, client=client)) for _ in range(3)]
            asks.append(Ask(AsyncRateLimiter(alone, 1, client=client)))
            return await try_acquire_all(client, asks)
        finally:
            await client.aclose()

    answers = asyncio.run(together())

    assert [a[0] for a in answers if isinstance(a, tuple)] == [1, 1, 0, 1]
    refused = answers[2]
    assert isinstance(refused, tuple) and 0 < refused[1] <= 1.0


def test_a_check_whose_script_redis_does_not_hold_is_asked_again_and_counted_once(
    stack: Stack,
) -> None:
    name = f"t-{uuid.uuid4().hex}"

    async def unknown_script() -> list[tuple[int, float] | BaseException]:
        client = redis.asyncio.Redis.from_url(stack.broker_url)
        try:
            limiter = AsyncRateLimiter(name, 2, client=client)
            limiter._script.sha = "0" * 40
            return await try_acquire_all(client, [Ask(limiter)])
        finally:
            await client.aclose()

    [answer] = asyncio.run(unknown_script())

    assert isinstance(answer, tuple) and answer[0]
    assert redis.Redis.from_url(stack.broker_url).zcard(RATE_LIMIT_KEY_PREFIX + name) == 1


def test_a_grant_of_several_units_takes_what_room_is_left_and_counts_each(stack: Stack) -> None:
    name = f"t-{uuid.uuid4().hex}"

    async def two_grants() -> list[tuple[int, float]]:
        client = redis.asyncio.Redis.from_url(stack.broker_url)
        try:
            limiter = AsyncRateLimiter(name, 7, 60, client=client)
            return [await limiter.try_take(4, "a"), await limiter.try_take(4, "b")]
        finally:
            await client.aclose()

    [(first, _), (second, _)] = asyncio.run(two_grants())

    assert (first, second) == (4, 3)
    threads = RateLimiter(name, 7, 60, client=redis.Redis.from_url(stack.broker_url))
    assert not threads.try_acquire()[0]


def _key_window(stack: Stack, limit: int, window_s: float) -> KeyWindow:
    client = redis.Redis.from_url(stack.broker_url)
    return KeyWindow(f"test-{uuid.uuid4().hex[:8]}", limit, window_s, client=client)


def test_a_key_window_grants_all_of_a_steps_units_or_none(stack: Stack) -> None:
    window = _key_window(stack, 3, 60.0)

    assert window.take(2, "a").granted
    refused = window.take(2, "b")
    assert not refused.granted and refused.used == 2
    assert 59 < refused.wait_s <= 60.001, "room for two once the oldest grant has left"
    assert window.take(1, "c").granted


def test_a_look_at_a_key_window_takes_nothing(stack: Stack) -> None:
    window = _key_window(stack, 1, 60.0)

    assert window.look(1).wait_s == 0 and window.look(1).used == 0
    assert window.take(1, "a").granted
    assert window.look(1).wait_s > 59


def test_a_key_window_grants_extra_units_only_from_the_room_left(stack: Stack) -> None:
    window = _key_window(stack, 5, 60.0)

    assert window.take(2, "a", extra=2).granted == 4
    assert window.take(1, "b", extra=9).granted == 1
    assert window.take(1, "c", extra=9).granted == 0
