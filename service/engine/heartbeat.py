"""Lease renewal for the steps running in this process, on one background thread.

A step that finishes within one renewal interval never touches the database for its lease, and
no thread is started or joined per step.
"""

import itertools
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


class Heartbeats:
    def __init__(self, sessions: sessionmaker[Session], lease_s: float) -> None:
        self._sessions = sessions
        self._lease_s = lease_s
        self._interval_s = min(1.0, lease_s / 3)
        self._held: dict[int, _Held] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def hold(
        self, key: StepKey, lease: Lease, lost: threading.Event
    ) -> AbstractContextManager[None]:
        """Keep a step's ``lease`` alive while the block runs; ``lost`` is set if it is taken
        away."""

        def renew(session: Session, lease_s: float, now: datetime) -> bool:
            return renew_lease(session, key, lease, lease_s, now)

        return self.hold_lease(renew, lost)

    @contextmanager
    def hold_lease(self, renew: Renew, lost: threading.Event) -> Iterator[None]:
        """Keep any lease alive through ``renew`` while the block runs."""
        ident = next(self._ids)
        with self._lock:
            started = time.monotonic()
            self._held[ident] = _Held(renew, lost, started, started)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="leases", daemon=True)
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                del self._held[ident]

    def _run(self) -> None:
        while True:
            time.sleep(self._interval_s)
            with self._lock:
                due = [
                    h for h in self._held.values() if time.monotonic() - h.since >= self._interval_s
                ]
            for held in due:
                self._renew(held)

    def _renew(self, held: _Held) -> None:
        """A renewal that cannot reach PostgreSQL leaves the lease to lapse there; once it
        would have, another worker may hold the step, so this one is told it lost it rather
        than go on running the action beside the new holder."""
        try:
            with unit_of_work(self._sessions) as session:
                kept = held.renew(session, self._lease_s, utcnow())
        except OperationalError:
            if time.monotonic() - held.kept_at >= self._lease_s:
                held.lost.set()
            return
        if not kept:
            held.lost.set()
            return
        held.kept_at = time.monotonic()
