"""Stopping an attempt whose action does not look at its cancel event, from its own process.

An action learns from ``ctx.cancel_event`` that its job ended or its lease was lost; one blocked
in a call that never looks (a slow read, a plain sleep) would hold its worker's slot until the
call returns. Celery's ``revoke(terminate=True)`` would stop it by signalling the pool process
that ran the task, but by the time the signal lands that process may be running another job's
step, which then fails as timed out (Celery's own docs say never to call it from code). The
process running the attempt knows which attempt it runs: it signals its own main thread, and the
handler raises only while that same attempt still runs. Only a main thread takes signals (the
prefork and solo pools); in a thread pool the cancel event is all an action gets.
"""

import signal
import threading
from types import FrameType, TracebackType

from service.engine.steps import StepKey
from service.platform.errors import StepCancelled

SIGNAL = signal.SIGUSR2
"""Not ``SIGUSR1``, which billiard's pool process takes as Celery's soft time limit, nor
``SIGALRM``, which times the steps a message runs one after another (``tasks.inline``)."""


class Window:
    """The span of one attempt in which an interrupt raises; made before the attempt's lease
    is held, so that the lease's watcher can be handed :meth:`interrupt`."""

    def __init__(self, owner: "Interrupts", key: StepKey) -> None:
        self._owner = owner
        self.key = key

    def interrupt(self) -> None:
        """Safe from any thread, at any time: once the window has closed it does nothing."""
        self._owner.interrupt(self)

    def __enter__(self) -> "Window":
        self._owner.open(self)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._owner.close(self)


class Interrupts:
    """One per process, since signal handlers are: at most one window is open at a time, on
    the main thread."""

    def __init__(self) -> None:
        self._open: Window | None = None
        self._due: Window | None = None
        self._installed = False

    def window(self, key: StepKey) -> Window:
        return Window(self, key)

    def open(self, window: Window) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if not self._installed:
            signal.signal(SIGNAL, self._handle)
            self._installed = True
        self._due = None
        self._open = window

    def close(self, window: Window) -> None:
        if self._open is window:
            self._open = None
            self._due = None

    def interrupt(self, window: Window) -> None:
        """A window closed after the check below leaves ``_due`` naming a closed window, which
        the handler ignores: the signal never raises outside the attempt it was sent for."""
        if self._open is not window:
            return
        self._due = window
        main = threading.main_thread().ident
        if main is not None:
            signal.pthread_kill(main, SIGNAL)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        due, self._due = self._due, None
        if due is not None and due is self._open:
            key = due.key
            raise StepCancelled(f"step {key.step_id} of job {key.job_id} went on past its cancel")


INTERRUPTS = Interrupts()
