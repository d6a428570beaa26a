"""Lease renewal for the steps running in this process, on two background threads.

A step that finishes within one renewal interval never touches the database for its lease, and
no thread is started or joined per step. One thread keeps the time and tells a step it lost its
lease once the lease would have lapsed; the other renews. A renewal stuck on a connection whose
packets a partition drops holds up only the renewals behind it, never the telling. A step told
and still held a tick later is stopped, if it gave a way to (``service.engine.interrupts``).
"""

import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from service.engine.leases import renew_lease
from service.engine.steps import Lease, StepKey
from service.platform.clock import utcnow
from service.platform.db import unit_of_work

Renew = Callable[[Session, float, datetime], bool]
"""Extends one lease by the given seconds from the given moment; ``False`` once it is lost."""


@dataclass
class _Held:
    renew: Renew
    lost: threading.Event
    since: float
    kept_at: float
    """When the lease was last known to hold: claimed, or renewed."""
    stop: Callable[[], None] | None
    told: bool = False


class Heartbeats:
    def __init__(self, sessions: sessionmaker[Session], lease_s: float) -> None:
        self._sessions = sessions
        self._lease_s = lease_s
        self._interval_s = min(1.0, lease_s / 3)
        self._held: dict[int, _Held] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._due: queue.SimpleQueue[list[_Held]] = queue.SimpleQueue()
        self._idle = threading.Event()
        self._idle.set()

    def hold(
        self,
        key: StepKey,
        lease: Lease,
        lost: threading.Event,
        stop: Callable[[], None] | None = None,
    ) -> AbstractContextManager[None]:
        """Keep a step's ``lease`` alive while the block runs; ``lost`` is set if it is taken
        away, and ``stop`` called if the block still runs a tick after that."""

        def renew(session: Session, lease_s: float, now: datetime) -> bool:
            return renew_lease(session, key, lease, lease_s, now)

        return self.hold_lease(renew, lost, stop)

    @contextmanager
    def hold_lease(
        self, renew: Renew, lost: threading.Event, stop: Callable[[], None] | None = None
    ) -> Iterator[None]:
        """Keep any lease alive through ``renew`` while the block runs."""
        ident = next(self._ids)
        with self._lock:
            started = time.monotonic()
            self._held[ident] = _Held(renew, lost, started, started, stop)
            if not self._threads or not all(t.is_alive() for t in self._threads):
                self._start()
        try:
            yield
        finally:
            with self._lock:
                del self._held[ident]

    def _start(self) -> None:
        """Also in a child forked from a process that had started them: threads do not
        survive a fork, and neither may a renewal the parent had in flight."""
        self._due = queue.SimpleQueue()
        self._idle.set()
        self._threads = [
            threading.Thread(target=self._run, name="leases", daemon=True),
            threading.Thread(target=self._renew_due, name="renewals", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _run(self) -> None:
        """A lease not renewed in time lapses in PostgreSQL, and another worker may then hold
        the step: this one is told it lost it rather than go on running the action beside the
        new holder, whether its renewals fail or have not come back."""
        while True:
            time.sleep(self._interval_s)
            now = time.monotonic()
            with self._lock:
                held = list(self._held.values())
            for lapsed in (h for h in held if now - h.kept_at >= self._lease_s):
                lapsed.lost.set()
            for told in (h for h in held if h.lost.is_set() and h.stop is not None):
                self._stop_if_deaf(told)
            due = [h for h in held if now - h.since >= self._interval_s and not h.lost.is_set()]
            if due and self._idle.is_set():
                self._idle.clear()
                self._due.put(due)

    @staticmethod
    def _stop_if_deaf(held: _Held) -> None:
        """A tick is the grace of an action that looks at its cancel event."""
        if not held.told:
            held.told = True
        elif held.stop is not None:
            stop, held.stop = held.stop, None
            stop()

    def _renew_due(self) -> None:
        while True:
            due = self._due.get()
            try:
                for held in due:
                    self._renew(held)
            finally:
                self._idle.set()

    def _renew(self, held: _Held) -> None:
        sent = time.monotonic()
        try:
            with unit_of_work(self._sessions) as session:
                kept = held.renew(session, self._lease_s, utcnow())
        except OperationalError:
            return
        if not kept:
            held.lost.set()
            return
        held.kept_at = sent
