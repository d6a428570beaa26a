"""The coalescer: what queues up behind a flush goes out together in the next, never waiting."""

import asyncio
import contextvars
from collections.abc import Sequence

import pytest

from api.batching import Coalescer


class Recorder:
    """A flush that records its batches and holds each until the test lets it go."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.release = asyncio.Event()

    async def flush(self, batch: Sequence[int]) -> list[int | BaseException]:
        self.batches.append(list(batch))
        await self.release.wait()
        return [ValueError(item) if item < 0 else item * 10 for item in batch]


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_lone_item_is_flushed_at_once_on_its_own() -> None:
    async def scenario() -> None:
        recorder = Recorder()
        recorder.release.set()
        assert await Coalescer(recorder.flush, max_items=8).submit(3) == 30
        assert recorder.batches == [[3]]

    asyncio.run(scenario())


def test_items_that_arrive_during_a_flush_go_out_together_in_the_next() -> None:
    async def scenario() -> None:
        recorder = Recorder()
        coalescer = Coalescer(recorder.flush, max_items=8)
        first = asyncio.create_task(coalescer.submit(1))
        await _settle()
        rest = [asyncio.create_task(coalescer.submit(n)) for n in (2, 3, 4)]
        await _settle()
        assert recorder.batches == [[1]]
        recorder.release.set()
        assert await asyncio.gather(first, *rest) == [10, 20, 30, 40]
        assert recorder.batches == [[1], [2, 3, 4]]

    asyncio.run(scenario())


def test_a_batch_holds_at_most_max_items() -> None:
    async def scenario() -> None:
        recorder = Recorder()
        coalescer = Coalescer(recorder.flush, max_items=2)
        first = asyncio.create_task(coalescer.submit(1))
        await _settle()
        rest = [asyncio.create_task(coalescer.submit(n)) for n in (2, 3, 4, 5, 6)]
        await _settle()
        recorder.release.set()
        await asyncio.gather(first, *rest)
        assert recorder.batches == [[1], [2, 3], [4, 5], [6]]

    asyncio.run(scenario())


def test_each_caller_gets_its_own_answer_or_its_own_error() -> None:
    async def scenario() -> None:
        recorder = Recorder()
        recorder.release.set()
        coalescer = Coalescer(recorder.flush, max_items=8)
        results = await asyncio.gather(
            *(coalescer.submit(n) for n in (1, -2, 3)), return_exceptions=True
        )
        assert results[0] == 10 and results[2] == 30
        assert isinstance(results[1], ValueError)

    asyncio.run(scenario())


def test_a_flush_that_fails_fails_its_whole_batch_and_not_the_next() -> None:
    calls: list[list[int]] = []

    async def flaky(batch: Sequence[int]) -> list[int | BaseException]:
        calls.append(list(batch))
        if len(calls) == 1:
            raise ConnectionError("database away")
        return list(batch)

    async def scenario() -> None:
        coalescer = Coalescer(flaky, max_items=8)
        first = await asyncio.gather(coalescer.submit(1), return_exceptions=True)
        assert isinstance(first[0], ConnectionError)
        assert await coalescer.submit(2) == 2

    asyncio.run(scenario())


def test_a_cancelled_flush_cancels_its_callers_rather_than_leaving_them_waiting() -> None:
    async def cancelled(batch: Sequence[int]) -> list[int | BaseException]:
        raise asyncio.CancelledError

    async def scenario() -> None:
        coalescer = Coalescer(cancelled, max_items=8)
        waiting = [asyncio.create_task(coalescer.submit(n)) for n in (1, 2)]
        for task in waiting:
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(scenario())


def test_a_flush_does_not_run_in_the_context_of_the_caller_that_started_it() -> None:
    caller: contextvars.ContextVar[str] = contextvars.ContextVar("caller", default="none")
    seen: list[str] = []

    async def flush(batch: Sequence[int]) -> list[int | BaseException]:
        seen.append(caller.get())
        return list(batch)

    async def scenario() -> None:
        caller.set("first")
        assert await Coalescer(flush, max_items=8).submit(1) == 1

    asyncio.run(scenario())
    assert seen == ["none"]
