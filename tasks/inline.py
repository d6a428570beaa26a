"""Running a chain's next steps in the pool process that ran the step before them.

A step's message has time limits ``CHAIN_SLICE_S`` longer than its step's timeout
(``canvas.step_signature``). While what is left of them still holds the next step's whole
timeout, the checkpoint claims that step and this process runs it, sparing its message, its
claim statement and the pool's hand-off. Each action is held to its own step's timeout here, by
a timer of this process that raises what Celery's soft limit raises; Celery's limits stay as the
backstop. Only a task running on its process's main thread (the prefork and solo pools) can
take signals, so only there do steps follow each other in one message.

A worker that sends task events gives every step its own message instead: Flower names a task
by the message it received, and would show a chain's later steps under its first step's name.
"""

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from celery import Task
from celery.exceptions import SoftTimeLimitExceeded

from service.engine.runner import Inline
from service.platform.constants import CHAIN_START_MARGIN_S
from service.platform.settings import Settings
from tasks import canvas
from tasks.queues import priority_of


class _StepTimer:
    """One ``SIGALRM`` timer per process, armed around one action at a time."""

    def __init__(self) -> None:
        self._armed: int | None = None
        self._installed = False

    def _expired(self, signum: int, frame: FrameType | None) -> None:
        timeout_s, self._armed = self._armed, None
        if timeout_s is not None:
            raise SoftTimeLimitExceeded(f"the step's timeout of {timeout_s} s")

    @contextmanager
    def timed(self, timeout_s: int) -> Iterator[None]:
        if not self._installed:
            signal.signal(signal.SIGALRM, self._expired)
            self._installed = True
        self._armed = timeout_s
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            yield
        finally:
            self._armed = None
            signal.setitimer(signal.ITIMER_REAL, 0)


_TIMER = _StepTimer()


def inline_for(task: Task, settings: Settings) -> Inline | None:
    """How this task's message may run the steps that follow its step; ``None`` where it
    cannot time them itself or has no time limit to budget. Where its worker sends task
    events, none follows, but each action is still held to its own step's timeout."""
    limits = task.request.timelimit
    soft_s: float | None = limits[1] if limits else None
    if not soft_s or threading.current_thread() is not threading.main_thread():
        return None
    started = time.monotonic()

    def fits(timeout_s: int) -> bool:
        if settings.task_events:
            return False
        return time.monotonic() - started + timeout_s + CHAIN_START_MARGIN_S <= soft_s

    priority = priority_of((task.request.delivery_info or {}).get("priority"))
    return Inline(fits, _TIMER.timed, lambda plan: canvas.send_plan(task.app, plan.at(priority)))
