"""Following a job from a terminal: the event log, woken by the process's listener.

``flowbeat run`` and ``flowbeat jobs watch`` print one line per step change as the log records
it, and a progress bar per fan-out step from its batched progress events. Like the API's
streams, they read the log after each notification, so a notification they miss costs a
second's delay, never a line.
"""

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn
from sqlalchemy.orm import Session, sessionmaker

from service.engine.events import Event, events_after, job_settled
from service.engine.jobs import get_job, job_view
from service.engine.steplogs import LogLine, read_lines, step_lines
from service.platform.constants import EVENT_LISTEN_RETRY_S, EVENT_PAGE_ROWS, STEP_LOG_PAGE_ROWS
from service.platform.db import sessions_of, unit_of_work
from service.platform.listener import EventListener
from service.platform.settings import Settings

_STEP_FINAL = {"succeeded", "failed", "skipped", "cancelled", "reused", "cached", "rejected"}


class _Printer:
    def __init__(self, console: Console, progress: Progress, sessions: sessionmaker[Session]):
        self.console = console
        self.progress = progress
        self.sessions = sessions
        self.bars: dict[str, TaskID] = {}

    def show(self, event: Event) -> None:
        family, _, status = event.kind.partition(".")
        if event.kind == "step.progress":
            self._advance(event)
        elif family == "step" and event.step_id is not None:
            self._step(event, status)
        elif family in ("approval", "compensation"):
            self._line(f"  {event.step_id or '':<24} {family} {status}")
        elif event.kind == "sleeping":
            self._line(f"  {event.data['step_id']:<24} wakes at {event.data['wake_at']}")
        elif family not in ("job",):
            self._line(f"  {event.kind}")

    def _step(self, event: Event, status: str) -> None:
        assert event.step_id is not None
        extra = ""
        attempt = int(event.data.get("attempt", 1))
        if status == "running" and attempt > 1:
            extra = f" (attempt {attempt})"
        if int(event.data.get("round", 1)) > 1:
            extra += f" (round {event.data['round']})"
        if status in _STEP_FINAL:
            extra += self._settle_bar(event.job_id, event.step_id)
        source = event.data.get("cached_from")
        if isinstance(source, dict):
            extra += f" from job {source.get('job_id')} step {source.get('step_id')}"
        self._line(f"  {event.step_id:<24} {status}{extra}")
        error = event.data.get("error")
        if isinstance(error, dict):
            self._line(f"    {error.get('code')}: {error.get('message')}")

    def _settle_bar(self, job_id: uuid.UUID, step_id: str) -> str:
        """Draw the bar at its final count before it goes: the last progress batch may be
        folded into the step's own final event, and the bar would vanish short of its end."""
        with unit_of_work(self.sessions) as session:
            view = job_view(session, get_job(session, job_id))
        shards: dict[str, Any] = next(
            (s.shards or {} for s in view.steps if s.step_id == step_id), {}
        )
        bar = self.bars.pop(step_id, None)
        if bar is not None:
            ended = sum(int(shards.get(status, 0)) for status in ("succeeded", "cached", "failed"))
            self.progress.update(bar, completed=ended, total=shards.get("total"))
            self.progress.refresh()
            self.progress.remove_task(bar)
        if not shards:
            return ""
        done = int(shards.get("succeeded", 0)) + int(shards.get("cached", 0))
        return f" ({done}/{shards['total']} items)"

    def _advance(self, event: Event) -> None:
        assert event.step_id is not None
        done = int(event.data.get("done", 0)) + int(event.data.get("failed", 0))
        total = int(event.data.get("total", 0))
        bar = self.bars.get(event.step_id)
        if bar is None:
            bar = self.progress.add_task(event.step_id, total=total)
            self.bars[event.step_id] = bar
        self.progress.update(bar, completed=done, total=total)

    def _line(self, text: str) -> None:
        """Plain text: step ids and errors are the user's, and rich would take ``[x]`` in them
        for markup and drop it."""
        self.progress.console.print(text, highlight=False, markup=False)


@contextmanager
def _woken_on_news(settings: Settings, job_id: uuid.UUID) -> Iterator[threading.Event]:
    listener = EventListener(settings.listen_url()).start()
    news = threading.Event()
    listener.subscribe(job_id, lambda _: news.set())
    try:
        yield news
    finally:
        listener.stop()


def follow(settings: Settings, job_id: uuid.UUID, timeout_s: float, console: Console) -> str:
    """Print the job's changes until it is settled; its final status, or ``"timeout"``."""
    sessions = sessions_of(settings)
    progress = Progress(
        TextColumn("  {task.description:<24}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=console,
        transient=True,
    )
    printer = _Printer(console, progress, sessions)
    deadline = time.monotonic() + timeout_s
    after = 0
    with _woken_on_news(settings, job_id) as news, progress:
        while time.monotonic() < deadline:
            news.clear()
            with unit_of_work(sessions) as session:
                settled = job_settled(session, job_id)
                events = events_after(session, job_id, after)
            for event in events:
                printer.show(event)
                after = event.seq
            if len(events) == EVENT_PAGE_ROWS:
                continue
            if settled:
                with unit_of_work(sessions) as session:
                    return get_job(session, job_id).status
            news.wait(min(EVENT_LISTEN_RETRY_S, max(0.0, deadline - time.monotonic())))
    return "timeout"


def log_lines(
    settings: Settings,
    job_id: uuid.UUID,
    step_id: str | None,
    *,
    attempt: int | None = None,
    follow: bool = False,
    timeout_s: float = 3600.0,
) -> Iterator[LogLine]:
    """A job's log lines (one step's, one attempt's), oldest first; with ``follow``, then the
    lines written after, until the job is settled or ``timeout_s`` has passed. Woken as the
    event streams are: each attempt's write notifies the job's channel."""
    sessions = sessions_of(settings)
    deadline = time.monotonic() + timeout_s
    after = 0

    def page() -> tuple[bool, list[LogLine]]:
        with unit_of_work(sessions) as session:
            settled = job_settled(session, job_id)
            if step_id is None:
                get_job(session, job_id)
                lines = read_lines(
                    session, job_id, attempt=attempt, after=after, limit=STEP_LOG_PAGE_ROWS
                )
            else:
                lines = step_lines(
                    session,
                    job_id,
                    step_id,
                    owner=None,
                    attempt=attempt,
                    after=after,
                    limit=STEP_LOG_PAGE_ROWS,
                )
            return settled, lines

    if not follow:
        while True:
            _, lines = page()
            yield from lines
            if len(lines) < STEP_LOG_PAGE_ROWS:
                return
            after = lines[-1].id
    with _woken_on_news(settings, job_id) as news:
        while time.monotonic() < deadline:
            news.clear()
            settled, lines = page()
            yield from lines
            if lines:
                after = lines[-1].id
            if len(lines) == STEP_LOG_PAGE_ROWS:
                continue
            if settled:
                return
            news.wait(min(EVENT_LISTEN_RETRY_S, max(0.0, deadline - time.monotonic())))
