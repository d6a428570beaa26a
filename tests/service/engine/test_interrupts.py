"""An attempt is interrupted only while it runs: a blocked call in its window stops at once,
and an interrupt sent for a window that has closed reaches nothing, not even the next one."""

import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from service.engine.interrupts import SIGNAL, Interrupts
from service.engine.steps import StepKey
from service.platform.errors import StepCancelled

BLOCKED_S = 30.0
KEY = StepKey(uuid.UUID(int=1), "a")


def _later(seconds: float, call: Callable[[], None]) -> threading.Timer:
    timer = threading.Timer(seconds, call)
    timer.start()
    return timer


@pytest.fixture(autouse=True)
def _handler_restored() -> Iterator[None]:
    """Each ``Interrupts`` here installs its own handler; the process's own goes back after."""
    before = signal.getsignal(SIGNAL)
    yield
    signal.signal(SIGNAL, before)


def test_these_tests_run_where_signals_are_taken() -> None:
    assert threading.current_thread() is threading.main_thread()


def test_an_interrupt_stops_a_call_blocked_in_its_window() -> None:
    interrupts = Interrupts()
    window = interrupts.window(KEY)
    started = time.monotonic()
    with pytest.raises(StepCancelled, match="went on past its cancel"), window:
        _later(0.2, window.interrupt)
        time.sleep(BLOCKED_S)
    assert time.monotonic() - started < BLOCKED_S / 3


def test_an_interrupt_for_a_closed_window_reaches_nothing_after_it() -> None:
    interrupts = Interrupts()
    first = interrupts.window(KEY)
    with first:
        pass
    first.interrupt()
    with interrupts.window(KEY):
        _later(0.05, first.interrupt).join()
        time.sleep(0.2)
    time.sleep(0.1)


def test_an_interrupt_that_lands_after_its_window_closed_raises_nothing() -> None:
    """As when the lease's watcher finds the window open just before the attempt returns:
    the signal is held back until the window has closed, and is then ignored."""
    interrupts = Interrupts()
    window = interrupts.window(KEY)
    signal.pthread_sigmask(signal.SIG_BLOCK, {SIGNAL})
    try:
        with window:
            window.interrupt()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {SIGNAL})
    time.sleep(0.05)


def test_off_the_main_thread_an_interrupt_is_only_the_cancel_event() -> None:
    interrupts = Interrupts()
    finished = threading.Event()

    def attempt() -> None:
        window = interrupts.window(KEY)
        with window:
            window.interrupt()
            time.sleep(0.2)
        finished.set()

    thread = threading.Thread(target=attempt)
    thread.start()
    thread.join(timeout=5)
    assert finished.is_set()
