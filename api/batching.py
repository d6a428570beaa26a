"""Work that arrives while the previous batch is in flight goes out together.

This is group commit done by the caller: an idle API sends each job at once, as before, and an
API that is falling behind sends the jobs that queued up behind one round trip in the next, so
what each job costs falls as the load rises instead of the backlog growing. There is no
lingering: a batch never waits for company.
"""

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

Flush = Callable[[Sequence[T]], Awaitable[Sequence[R | BaseException]]]
"""Takes a batch and answers for each of its items, in order: a result, or the error that
item's caller should get."""


class Coalescer(Generic[T, R]):
    """One flush in flight at a time, over everything that queued up since the last began.

    The flush runs in a context of its own: it works for many callers, so what one of them
    bound for its log lines (``logs.bound``) must not label the flush's."""

    def __init__(self, flush: Flush[T, R], max_items: int) -> None:
        self._flush = flush
        self._max_items = max_items
        self._queued: list[tuple[T, asyncio.Future[R]]] = []
        self._drainer: asyncio.Task[None] | None = None

    async def submit(self, item: T) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queued.append((item, future))
        if self._drainer is None:
            self._drainer = asyncio.create_task(self._drain(), context=contextvars.Context())
        return await future

    async def _drain(self) -> None:
        batch: list[tuple[T, asyncio.Future[R]]] = []
        try:
            while self._queued:
                batch = self._queued[: self._max_items]
                del self._queued[: self._max_items]
                await self._answer(batch)
        except BaseException:
            for _, future in batch + self._queued:
                future.cancel()
            self._queued.clear()
            raise
        finally:
            self._drainer = None

    async def _answer(self, batch: list[tuple[T, "asyncio.Future[R]"]]) -> None:
        try:
            results = await self._flush([item for item, _ in batch])
        except Exception as exc:
            results = [exc] * len(batch)
        for (_, future), result in zip(batch, results, strict=True):
            if future.done():
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)
