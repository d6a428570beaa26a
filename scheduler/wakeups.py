"""The beat leader's wake-up call: PostgreSQL ``LISTEN`` on the channel a schedule save notifies.

RedBeat, like celery beat, only polls: a schedule added while the leader sleeps is seen when the
sleep ends, up to ``max_interval`` later. Here the leader sleeps up to a third of the lock TTL,
so a new schedule's first fires went out seconds late, all at once. A save instead sends
``NOTIFY`` in its own transaction (``service.triggers.schedules.put_schedule``), which PostgreSQL
delivers only once that transaction commits, so a woken leader always finds the row it was
woken for, and a save that rolls back wakes nobody. The leader listens before it reads the due
schedules, so a save committed while it reads is still in the connection when it goes to sleep.
"""

import logging
from typing import Any

import psycopg

from service.platform.constants import SCHEDULES_CHANNEL
from service.platform.db import KEEPALIVES, connect_kwargs, libpq_url

log = logging.getLogger(__name__)


class ScheduleWakeups:
    """One autocommitted connection listening on ``SCHEDULES_CHANNEL`` while this replica leads."""

    def __init__(self, database_url: str) -> None:
        self._conninfo = libpq_url(database_url)
        self._network = {
            **connect_kwargs(database_url, pooled=False),
            **KEEPALIVES,
            "connect_timeout": 5,
        }
        self._conn: psycopg.Connection[Any] | None = None

    def listen(self) -> None:
        """Start listening unless already; a failure leaves the leader to its timed ticks."""
        if self._conn is not None:
            return
        try:
            conn = psycopg.connect(self._conninfo, autocommit=True, **self._network)
            conn.execute(f"LISTEN {SCHEDULES_CHANNEL}")
        except psycopg.Error as exc:
            log.warning("beat: cannot listen for schedule changes, ticking on time: %s", exc)
            return
        self._conn = conn

    def wait(self, timeout_s: float) -> bool | None:
        """Block until a schedule changes or ``timeout_s`` passes: True when woken, False on
        time, None when not listening (the caller sleeps instead). Notices that arrived
        together are taken at once, so a burst of saves costs one tick."""
        if self._conn is None:
            return None
        try:
            woken = any(True for _ in self._conn.notifies(timeout=timeout_s, stop_after=1))
            if woken:
                for _ in self._conn.notifies(timeout=0):
                    pass
        except psycopg.Error as exc:
            log.warning("beat: lost the schedule listener, ticking on time: %s", exc)
            self.close()
            return None
        return woken

    def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.close()
