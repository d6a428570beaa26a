"""A worker's timer keeps only the time limits of steps still running."""

from typing import Any

from kombu.asynchronous.timer import Timer

from tasks.timers import CompactTimers, compact
from tests.conftest import Stack


def _noop() -> None:
    return None


def _timer() -> Any:
    return Timer()  # type: ignore[no-untyped-call]  # kombu is unannotated


def test_cancelled_entries_leave_the_heap_and_live_ones_keep_their_order() -> None:
    timer = _timer()
    entries = [timer.call_after(300 - n, _noop) for n in range(100)]
    for entry in entries[::3]:
        entry.cancel()

    assert compact(timer) == 34
    assert len(timer) == 66
    assert [item.entry for item in timer.queue] == [e for e in entries[::-1] if not e.canceled]


def test_a_timer_with_nothing_cancelled_is_left_as_it_is() -> None:
    timer = _timer()
    timer.call_after(10, _noop)
    queue = timer._queue
    assert compact(timer) == 0
    assert timer._queue is queue and len(timer) == 1


def test_the_scheduler_still_fires_what_is_due_after_a_compaction() -> None:
    timer = _timer()
    fired: list[int] = []
    timer.call_after(0, fired.append, (1,))
    timer.call_after(0, fired.append, (2,)).cancel()
    timer.call_after(3600, fired.append, (3,))
    scheduler = iter(timer)
    compact(timer)
    for _ in range(3):
        _, entry = next(scheduler)
        if entry is not None:
            entry()
    assert fired == [1]


def test_every_flowbeat_worker_runs_the_compaction(stack: Stack) -> None:
    from service.platform.settings import Settings
    from tasks.app import create_celery  # builds the process-wide app: only once stack is up

    app = create_celery(Settings(broker_url=stack.broker_url))
    assert CompactTimers in app.steps["worker"]
