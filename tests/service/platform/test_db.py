"""Direct connections: one per thread, replaced when broken, durable only where it matters.
Autocommit is for one session's transaction, never for the pooled connection's next user."""

import threading
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.orm import sessionmaker

from service.engine.runtime import Runtime
from service.platform.db import (
    DirectConnections,
    autocommit,
    driver,
    make_engine,
    make_session_factory,
)


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


def _hang_up(url: str, pid: int) -> None:
    """End a backend as a server shutdown does: a last FATAL message, then its socket closes."""
    with DirectConnections(url).connect() as other:
        assert other.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,)).fetchone() == (True,)


def test_a_connection_its_server_hung_up_on_is_replaced_before_the_statement_fails(
    runtime: Runtime,
) -> None:
    """As after a restart of PostgreSQL: a checkpoint on the dead connection would fail, and
    its step's body would run again."""
    url = runtime.settings.require_database_url()
    direct = DirectConnections(url)
    with direct.connect() as first:
        pid = first.info.backend_pid
    _hang_up(url, pid)
    with direct.connect() as second:
        assert second.execute("SELECT pg_backend_pid()").fetchone() != (pid,)
    with direct.connect() as again:
        assert again is second


def test_a_pooled_connection_its_server_hung_up_on_is_replaced_at_checkout(
    runtime: Runtime,
) -> None:
    url = runtime.settings.require_database_url()
    engine = make_engine(url, pool_size=1)
    sessions = make_session_factory(engine)
    try:
        with sessions() as session:
            pid = session.execute(text("SELECT pg_backend_pid()")).scalar_one()
        _hang_up(url, pid)
        with sessions() as session:
            assert session.execute(text("SELECT pg_backend_pid()")).scalar_one() != pid
    finally:
        engine.dispose()


def test_autocommit_commits_each_statement_and_the_pool_gets_a_transactional_connection_back(
    runtime: Runtime,
) -> None:
    engine = create_engine(runtime.settings.require_database_url(), pool_size=1, max_overflow=0)
    sessions = sessionmaker(engine)
    table = f"autocommit_{threading.get_ident()}"
    try:
        with sessions() as session:
            autocommit(session)
            session.execute(text(f"CREATE TABLE {table} (n int)"))
            session.execute(text(f"INSERT INTO {table} VALUES (1)"))
            assert driver(session).autocommit
            session.rollback()
        with sessions() as session:
            assert session.execute(text(f"SELECT n FROM {table}")).scalar_one() == 1
            assert not driver(session).autocommit
            session.execute(text(f"INSERT INTO {table} VALUES (2)"))
            session.rollback()
            assert session.execute(text(f"SELECT count(*) FROM {table}")).scalar_one() == 1
    finally:
        with sessions() as session:
            session.execute(text(f"DROP TABLE IF EXISTS {table}"))
            session.commit()
        engine.dispose()


def test_a_session_already_in_a_transaction_stays_in_it(runtime: Runtime) -> None:
    with runtime.sessions() as session:
        session.execute(text("SELECT 1"))
        autocommit(session)
        assert not driver(session).autocommit
        assert session.in_transaction()
