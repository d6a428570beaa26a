"""One PostgreSQL ``LISTEN`` connection per process for the event log's notifications.

Every open stream of a process shares it: two hundred streams cost one connection, not two
hundred. A notification only says "job X has news"; the reader then reads the log, so a
notification lost while the connection was down costs nothing but a read, which every
subscriber is told to make (with ``None``) once the listener is back.
"""

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

from service.platform.constants import EVENT_LISTEN_RETRY_S, EVENTS_CHANNEL
from service.platform.db import KEEPALIVES, connect_kwargs, libpq_url

log = logging.getLogger(__name__)

REGISTER_WAIT_S = 5.0
"""How long a new listener waits for the transactions that began before it registered."""
REGISTER_POLL_S = 0.01

Wake = Callable[[uuid.UUID | None], None]
"""Told a job id with news, or ``None`` when any job may have news (after a reconnect)."""


_REGISTER = """
    WITH gone AS (
        DELETE FROM event_listeners
         WHERE pid NOT IN (SELECT pid FROM pg_stat_activity WHERE pid IS NOT NULL)
    )
    INSERT INTO event_listeners (pid) VALUES (pg_backend_pid()) ON CONFLICT DO NOTHING"""
_OLDER_STATEMENTS = """
    SELECT count(*) FROM pg_stat_activity
     WHERE datname = current_database() AND pid <> pg_backend_pid()
       AND backend_type = 'client backend' AND state <> 'idle' AND xact_start < %s"""


def register(conn: psycopg.Connection[Any], timeout_s: float = REGISTER_WAIT_S) -> None:
    """Make the step path notify ``conn``, which listens already, from now on (ADR 19).

    The step path's statements notify only while ``event_listeners`` has a row, and one that
    began before this row was committed does not see it: so once the row is in, this waits
    until every transaction of the database that began before is over, and a subscriber that
    reads the log after that misses nothing. Rows of connections that are gone are dropped on
    the way; a row a crash left behind only costs notifications that nobody hears."""
    conn.execute(_REGISTER)
    registered = conn.execute("SELECT clock_timestamp()").fetchone()
    assert registered is not None
    deadline = time.monotonic() + timeout_s
    while True:
        older = conn.execute(_OLDER_STATEMENTS, registered).fetchone()
        if not older or not older[0]:
            return
        if time.monotonic() > deadline:
            log.warning("event listener: %d older transactions still open, going on", older[0])
            return
        time.sleep(REGISTER_POLL_S)


def unregister(conn: psycopg.Connection[Any]) -> None:
    """Let the step path stop notifying ``conn`` (unless another connection listens too)."""
    conn.execute("DELETE FROM event_listeners WHERE pid = pg_backend_pid()")


class EventListener:
    def __init__(self, database_url: str) -> None:
        self._conninfo = libpq_url(database_url)
        self._network = {
            **connect_kwargs(database_url, pooled=False),
            **KEEPALIVES,
            "connect_timeout": 5,
        }
        self._lock = threading.Lock()
        self._by_job: dict[uuid.UUID, set[Wake]] = {}
        self._every: set[Wake] = set()
        self._stop = threading.Event()
        self._listening = threading.Event()
        self._thread = threading.Thread(target=self._run, name="event-listener", daemon=True)

    def start(self, timeout_s: float = 10.0) -> "EventListener":
        """Start listening; returns once the first ``LISTEN`` is in place, so a subscriber that
        reads the log after ``start`` misses no change committed after that read."""
        self._thread.start()
        self._listening.wait(timeout_s)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def subscribe(self, job_id: uuid.UUID | None, wake: Wake) -> Callable[[], None]:
        """Call ``wake`` on news of ``job_id`` (of every job for ``None``); returns the undo."""
        with self._lock:
            if job_id is None:
                self._every.add(wake)
            else:
                self._by_job.setdefault(job_id, set()).add(wake)

        def unsubscribe() -> None:
            with self._lock:
                if job_id is None:
                    self._every.discard(wake)
                    return
                waiting = self._by_job.get(job_id, set())
                waiting.discard(wake)
                if not waiting:
                    self._by_job.pop(job_id, None)

        return unsubscribe

    @property
    def subscribers(self) -> int:
        with self._lock:
            return len(self._every) + sum(len(w) for w in self._by_job.values())

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._conninfo, autocommit=True, **self._network) as conn:
                    conn.execute(f"LISTEN {EVENTS_CHANNEL}")
                    register(conn)
                    if self._listening.is_set():
                        self._wake_all()
                    self._listening.set()
                    self._drain(conn)
                    unregister(conn)
            except psycopg.Error as exc:
                log.warning("event listener lost its connection, reconnecting: %s", exc)
                self._stop.wait(EVENT_LISTEN_RETRY_S)

    def _drain(self, conn: psycopg.Connection[Any]) -> None:
        while not self._stop.is_set():
            for note in conn.notifies(timeout=EVENT_LISTEN_RETRY_S):
                self._wake(uuid.UUID(note.payload))

    def _wake(self, job_id: uuid.UUID) -> None:
        with self._lock:
            targets = [*self._by_job.get(job_id, ()), *self._every]
        for wake in targets:
            wake(job_id)

    def _wake_all(self) -> None:
        with self._lock:
            targets = [*(w for ws in self._by_job.values() for w in ws), *self._every]
        for wake in targets:
            wake(None)
