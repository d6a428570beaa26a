"""Time limits without the memory they otherwise hold in a worker's main process.

The prefork pool enforces a task's time limits with a timer entry per task in the main
process. A task that finishes in time cancels its entry, but the entry stays in the timer's
heap until it would have fired: every step of the last ``timeout_s`` seconds is held there
(Celery issues #1129, #1427, #5200). At 450 steps a second and the default 300 s that is some
90 MiB that grows with the rate, where a worker without limits stays flat
(``bench/worker_memory.py``). Every step has limits here, so the worker sweeps cancelled
entries out of the heap every ``TIMER_COMPACT_INTERVAL_S``.
"""

import heapq
from typing import Any

from celery import bootsteps
from kombu.asynchronous.timer import Timer

from service.platform.constants import TIMER_COMPACT_INTERVAL_S


def compact(timer: Timer) -> int:
    """Drop cancelled entries from ``timer``'s heap; returns how many. The list is changed in
    place, as ``Timer.clear`` does, because the timer's scheduler holds on to it."""
    queue: list[Any] = timer._queue
    live = [item for item in queue if not item.entry.canceled]
    dropped = len(queue) - len(live)
    if dropped:
        heapq.heapify(live)
        queue[:] = live
    return dropped


class CompactTimers(bootsteps.StartStopStep):  # type: ignore[misc]
    """Runs ``compact`` on the worker's event loop, where the timer lives, so nothing else
    touches the heap meanwhile. Pools without an event loop keep no such entries."""

    requires = ("celery.worker.components:Hub",)

    def start(self, worker: Any) -> None:
        hub = getattr(worker, "hub", None)
        if hub is not None:
            hub.call_repeatedly(TIMER_COMPACT_INTERVAL_S, compact, hub.timer)
