"""Direct connections: one per thread, replaced when broken, durable only where it matters."""

import threading
from typing import Any

from service.db import DirectConnections
from service.runtime import Runtime


def _setting(conn: Any) -> str:
    return str(conn.execute("SHOW synchronous_commit").fetchone()[0])


def test_claims_commit_asynchronously_and_checkpoints_wait_for_the_disk(runtime: Runtime) -> None:
    with runtime.claims.connect() as claims, runtime.checkpoints.connect() as checkpoints:
        assert _setting(claims) == "off"
        assert _setting(checkpoints) == "on"


def test_a_thread_keeps_its_connection_and_other_threads_get_their_own(
    runtime: Runtime,
) -> None:
    direct = DirectConnections(runtime.settings.require_database_url())
    with direct.connect() as first, direct.connect() as again:
        assert first is again
    seen: list[Any] = []

    def other() -> None:
        with direct.connect() as conn:
            seen.append(conn)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert seen and seen[0] is not first


def test_a_closed_connection_is_replaced(runtime: Runtime) -> None:
    direct = DirectConnections(runtime.settings.require_database_url())
    with direct.connect() as first:
        first.close()
    with direct.connect() as second:
        assert second is not first
        assert second.execute("SELECT 1").fetchone() == (1,)
