"""The all-jobs stream on a busy system: woken by every job's news, quiet for its own key."""

import asyncio
import threading
import uuid
from datetime import UTC, datetime

import psycopg
from sqlalchemy import make_url

from api.streams import Follower, Framing, Scope, all_jobs_stream
from service.engine.runtime import Runtime
from service.platform.constants import EVENTS_CHANNEL
from service.platform.listener import EventListener

KEEPALIVE_S = 0.3
LISTEN_S = 1.5
NOTIFY_EVERY_S = 0.05


def _notify_until(conninfo: str, stop: threading.Event) -> None:
    """Another owner's jobs making news, faster than the keep-alive interval."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        while not stop.wait(NOTIFY_EVERY_S):
            conn.execute("SELECT pg_notify(%s, %s)", (EVENTS_CHANNEL, str(uuid.uuid4())))


async def _read(runtime: Runtime, listener: EventListener) -> list[str]:
    scope = Scope(owner=f"quiet-{uuid.uuid4().hex[:6]}", pipeline=None, since=datetime.now(UTC))
    stream = all_jobs_stream(runtime, listener, scope, Framing(sse=False), KEEPALIVE_S)
    frames: list[str] = []

    async def collect() -> None:
        async for frame in stream:
            frames.append(frame)

    task = asyncio.create_task(collect())
    await asyncio.sleep(LISTEN_S)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return frames


def test_a_quiet_stream_keeps_alive_while_other_owners_jobs_wake_it(runtime: Runtime) -> None:
    url = runtime.settings.require_database_url()
    conninfo = make_url(url).set(drivername="postgresql").render_as_string(False)
    listener = EventListener(url).start()
    stop = threading.Event()
    noise = threading.Thread(target=_notify_until, args=(conninfo, stop), daemon=True)
    noise.start()
    try:
        frames = asyncio.run(_read(runtime, listener))
    finally:
        stop.set()
        noise.join(timeout=5)
        listener.stop()
    keepalives = [frame for frame in frames if frame == Framing(sse=False).keepalive]
    assert len(keepalives) >= int(LISTEN_S / KEEPALIVE_S) - 2, frames
    assert len(keepalives) == len([f for f in frames if f]), "no event of another owner"


async def _swallowed_cancellations(listener: EventListener) -> list[int]:
    """Cancel a waiting follower at each point from its news arriving to its waking up."""
    swallowed = []
    for hops in range(8):
        follower = Follower(listener, None)
        waiting = asyncio.create_task(follower.wait(60))
        await asyncio.sleep(0)
        follower._note(uuid.uuid4())
        for _ in range(hops):
            await asyncio.sleep(0)
        if not waiting.done():
            waiting.cancel()
            [outcome] = await asyncio.gather(waiting, return_exceptions=True)
            if not isinstance(outcome, asyncio.CancelledError):
                swallowed.append(hops)
        follower.close()
    return swallowed


def test_a_stream_cancelled_as_news_arrives_stops(runtime: Runtime) -> None:
    """A client that leaves just as its stream is woken must not leave the stream running."""
    listener = EventListener(runtime.settings.require_database_url())
    assert asyncio.run(_swallowed_cancellations(listener)) == []
