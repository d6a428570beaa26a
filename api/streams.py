"""Event streams: replay the log, then follow it as the process's listener says it grew.

A stream holds no database connection while it waits; it reads the log (through the thread
pool) only when its job has news or a keep-alive is due. It subscribes before it first reads,
so a change committed between the read and the wait still wakes it.
"""

import asyncio
import json
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime

from fastapi import FastAPI
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from service.engine.events import Event, events_after, events_of_jobs, events_since, job_settled
from service.engine.runtime import Runtime
from service.engine.steplogs import LogLine, read_lines
from service.platform.constants import EVENT_PAGE_ROWS, STEP_LOG_PAGE_MAX_ROWS
from service.platform.db import unit_of_work
from service.platform.listener import EventListener
from service.platform.models import JobRow
from service.platform.states import JOB_FINAL

SSE = "text/event-stream"
NDJSON = "application/x-ndjson"

_listener_lock = threading.Lock()


def listener_of(app: FastAPI) -> EventListener:
    """The app's one listener, started by the first stream that needs it. Starting waits up to
    ten seconds for the first LISTEN, so callers on the event loop run it in the thread pool."""
    with _listener_lock:
        listener: EventListener | None = getattr(app.state, "events_listener", None)
        if listener is None:
            runtime: Runtime = app.state.runtime
            listener = EventListener(runtime.settings.listen_url()).start()
            app.state.events_listener = listener
        return listener


def stop_listener(app: FastAPI) -> None:
    listener: EventListener | None = getattr(app.state, "events_listener", None)
    if listener is not None:
        listener.stop()


@dataclass
class Follower:
    """A stream's subscription: which jobs had news since it last looked."""

    listener: EventListener
    job_id: uuid.UUID | None
    _loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.get_running_loop)
    _woken: asyncio.Event = field(default_factory=asyncio.Event)
    _news: set[uuid.UUID] = field(default_factory=set)
    _everything: bool = False
    _unsubscribe: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        self._unsubscribe = self.listener.subscribe(self.job_id, self._from_thread)

    def _from_thread(self, job_id: uuid.UUID | None) -> None:
        self._loop.call_soon_threadsafe(self._note, job_id)

    def _note(self, job_id: uuid.UUID | None) -> None:
        if job_id is None:
            self._everything = True
        else:
            self._news.add(job_id)
        self._woken.set()

    async def wait(self, timeout_s: float) -> tuple[set[uuid.UUID], bool] | None:
        """The jobs with news and whether any job may have news; ``None`` when time is up.

        Not ``asyncio.wait_for``: on Python 3.11 it swallows a cancellation that arrives as the
        news does (gh-86296), and a stream whose client left would follow the log for ever."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._woken.wait()
        except TimeoutError:
            return None
        self._woken.clear()
        news, self._news = self._news, set()
        everything, self._everything = self._everything, False
        return news, everything

    def close(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None


def sse_frame(event: Event, event_id: str) -> str:
    return f"id: {event_id}\ndata: {json.dumps(event.public(), separators=(',', ':'))}\n\n"


def ndjson_line(event: Event) -> str:
    return json.dumps(event.public(), separators=(",", ":")) + "\n"


@dataclass(frozen=True)
class Framing:
    sse: bool

    def event(self, event: Event, event_id: str) -> str:
        return sse_frame(event, event_id) if self.sse else ndjson_line(event)

    @property
    def keepalive(self) -> str:
        return ": keep-alive\n\n" if self.sse else "\n"

    @property
    def opening(self) -> str:
        return "retry: 2000\n\n" if self.sse else ""

    @property
    def closing(self) -> str:
        """SSE clients reconnect whenever a stream ends; this tells them the job is done."""
        return "event: end\ndata: {}\n\n" if self.sse else ""


def _read_job(runtime: Runtime, job_id: uuid.UUID, after: int) -> tuple[bool, list[Event]]:
    with unit_of_work(runtime.sessions) as session:
        settled = job_settled(session, job_id)
        return settled, events_after(session, job_id, after)


async def job_stream(
    runtime: Runtime,
    listener: EventListener,
    job_id: uuid.UUID,
    after: int,
    framing: Framing,
    keepalive_s: float,
) -> AsyncIterator[str]:
    """The job's events after ``after``, then live ones, until the job is settled."""
    follower = Follower(listener, job_id)
    try:
        yield framing.opening
        while True:
            settled, events = await run_in_threadpool(_read_job, runtime, job_id, after)
            for event in events:
                yield framing.event(event, str(event.seq))
                after = event.seq
            if len(events) == EVENT_PAGE_ROWS:
                continue
            if settled:
                yield framing.closing
                return
            if await follower.wait(keepalive_s) is None:
                yield framing.keepalive
    finally:
        follower.close()


@dataclass(frozen=True)
class LogFilter:
    """Which lines a log stream follows: one step's, of one attempt or of all of them."""

    job_id: uuid.UUID
    step_id: str
    attempt: int | None


def _read_log(runtime: Runtime, which: LogFilter, after: int) -> tuple[bool, list[LogLine]]:
    with unit_of_work(runtime.sessions) as session:
        settled = job_settled(session, which.job_id)
        lines = read_lines(
            session,
            which.job_id,
            step_id=which.step_id,
            attempt=which.attempt,
            after=after,
            limit=STEP_LOG_PAGE_MAX_ROWS,
        )
        return settled, lines


def log_frame(line: LogLine, framing: Framing) -> str:
    data = json.dumps(line.public(), separators=(",", ":"))
    return f"id: {line.id}\ndata: {data}\n\n" if framing.sse else data + "\n"


async def log_stream(
    runtime: Runtime,
    listener: EventListener,
    which: LogFilter,
    after: int,
    framing: Framing,
    keepalive_s: float,
) -> AsyncIterator[str]:
    """A step's log lines after the line ``after``, then live ones, until the job is settled.

    Each attempt's lines are written with a notification on the event channel, so the job
    event stream's listener wakes this stream as it wakes that one; the line read after the
    job is settled is the last, since nothing runs then."""
    follower = Follower(listener, which.job_id)
    try:
        yield framing.opening
        while True:
            settled, lines = await run_in_threadpool(_read_log, runtime, which, after)
            for line in lines:
                yield log_frame(line, framing)
                after = line.id
            if len(lines) == STEP_LOG_PAGE_MAX_ROWS:
                continue
            if settled:
                yield framing.closing
                return
            if await follower.wait(keepalive_s) is None:
                yield framing.keepalive
    finally:
        follower.close()


def _final(runtime: Runtime, job_id: uuid.UUID) -> bool:
    with unit_of_work(runtime.sessions) as session:
        status = session.scalar(select(JobRow.status).where(JobRow.id == job_id))
    return status is None or status in JOB_FINAL


async def wait_until_final(
    runtime: Runtime, listener: EventListener, job_id: uuid.UUID, timeout_s: float
) -> None:
    """Return once the job is final or ``timeout_s`` has passed, whichever is first."""
    follower = Follower(listener, job_id)
    deadline = asyncio.get_running_loop().time() + timeout_s
    try:
        while not await run_in_threadpool(_final, runtime, job_id):
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return
            await follower.wait(left)
    finally:
        follower.close()


@dataclass
class Scope:
    owner: str | None
    pipeline: str | None
    since: datetime
    seen: dict[uuid.UUID, int] = field(default_factory=dict)
    cursor: datetime | None = None

    def fresh(self, events: list[Event]) -> list[Event]:
        """Drop what was already sent; remember the newest of each job, and the read point."""
        out = []
        for event in events:
            if event.seq > self.seen.get(event.job_id, 0):
                self.seen[event.job_id] = event.seq
                out.append(event)
            if self.cursor is None or event.at > self.cursor:
                self.cursor = event.at
        return out


def _replay(runtime: Runtime, scope: Scope) -> tuple[list[Event], bool]:
    with unit_of_work(runtime.sessions) as session:
        rows = events_since(
            session, owner=scope.owner, pipeline=scope.pipeline, since=scope.cursor or scope.since
        )
    return scope.fresh(rows), len(rows) >= EVENT_PAGE_ROWS


def _news(runtime: Runtime, scope: Scope, job_ids: set[uuid.UUID]) -> list[Event]:
    with unit_of_work(runtime.sessions) as session:
        rows = events_of_jobs(
            session,
            scope.seen,
            job_ids,
            owner=scope.owner,
            pipeline=scope.pipeline,
            since=scope.since,
        )
    return scope.fresh(rows)


async def all_jobs_stream(
    runtime: Runtime, listener: EventListener, scope: Scope, framing: Framing, keepalive_s: float
) -> AsyncIterator[str]:
    """Every event in scope from ``since`` on, then live ones, until the client leaves.

    Every job's news wakes this stream, mostly news it may not read (another owner's, another
    pipeline's), so the keep-alive is due by the time since the stream last wrote, not since
    it last woke: on a busy system a quiet stream would otherwise send nothing at all."""
    follower = Follower(listener, None)
    try:
        yield framing.opening
        full = True
        while full:
            events, full = await run_in_threadpool(_replay, runtime, scope)
            for event in events:
                yield framing.event(event, event.at.isoformat())
        clock = asyncio.get_running_loop().time
        wrote_at = clock()
        while True:
            left = keepalive_s - (clock() - wrote_at)
            woken = await follower.wait(left) if left > 0 else None
            if woken is None:
                yield framing.keepalive
                wrote_at = clock()
                continue
            news, everything = woken
            if everything:
                events, _ = await run_in_threadpool(_replay, runtime, scope)
            else:
                events = await run_in_threadpool(_news, runtime, scope, news)
            for event in events:
                yield framing.event(event, event.at.isoformat())
            if events:
                wrote_at = clock()
    finally:
        follower.close()
