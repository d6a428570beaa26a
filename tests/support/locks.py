"""Waiting, in a test, until another backend of its database waits for an advisory lock: the
moment two writers meet, awaited rather than slept for."""

import time

import psycopg

from service.engine.runtime import Runtime
from service.platform.db import libpq_url

WAITER = """
    SELECT count(*) FROM pg_locks
     WHERE locktype = 'advisory' AND NOT granted
       AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


def wait_for_a_lock_waiter(rt: Runtime, who: str, timeout_s: float = 10) -> None:
    """Until a backend of the test database waits for an advisory lock; ``who`` says which one
    the test expects, in the failure."""
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(libpq_url(rt.settings.require_database_url()), autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(WAITER).fetchone()
            if row and row[0]:
                return
            time.sleep(0.01)
    raise AssertionError(f"{who} never waited")
