"""The event log's listeners: the step path notifies only while one is registered, and one
that registers misses nothing that statements begun before it commit (ADR 19)."""

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from service.engine.runner import run_step
from service.engine.runtime import Runtime
from service.engine.steps import StepKey
from service.language.plan import JobPlan
from service.platform.constants import EVENTS_CHANNEL
from service.platform.db import libpq_url
from service.platform.listener import register, unregister
from service.platform.settings import Settings
from tests.conftest import Stack
from tests.e2e.conftest import wait_for
from tests.support.fanouts import submitted
from tests.support.servers import private_database

ONE_STEP: dict[str, Any] = {"name": "one", "steps": [{"id": "a", "action": "noop"}]}
GONE_PID = 2_147_483_000


@pytest.fixture(scope="module")
def runtime(stack: Stack) -> Iterator[Runtime]:
    """A database of its own: another test's listener, registered in the shared one, would
    have the step path notify."""
    with private_database("flowbeat_listeners") as url:
        rt = Runtime.start(Settings(database_url=url, broker_url=stack.broker_url))
        yield rt
        rt.sessions.kw["bind"].dispose()


@pytest.fixture
def ear(runtime: Runtime) -> Iterator[psycopg.Connection[Any]]:
    """A connection listening on the log's channel, registered or not as the test decides."""
    with psycopg.connect(_conninfo(runtime), autocommit=True) as conn:
        conn.execute(f"LISTEN {EVENTS_CHANNEL}")
        try:
            yield conn
        finally:
            unregister(conn)


def _conninfo(rt: Runtime) -> str:
    return libpq_url(rt.settings.require_database_url())


def _stored_and_run(rt: Runtime) -> uuid.UUID:
    key = StepKey(submitted(rt, ONE_STEP, {}), "a")
    assert run_step(rt, key, task_id=uuid.uuid4().hex) == JobPlan(key.job_id)
    return key.job_id


def _heard(rt: Runtime, ear: psycopg.Connection[Any]) -> set[str]:
    """What ``ear`` heard before a marker sent now: notifications arrive in commit order, so
    whatever an earlier commit sent comes before it."""
    marker = uuid.uuid4().hex
    with psycopg.connect(_conninfo(rt), autocommit=True) as conn:
        conn.execute("SELECT pg_notify(%s, %s)", (EVENTS_CHANNEL, marker))
    heard: set[str] = set()
    for note in ear.notifies(timeout=10):
        if note.payload == marker:
            return heard
        heard.add(note.payload)
    raise AssertionError("the marker was never heard")


def _registered(rt: Runtime) -> set[int]:
    with psycopg.connect(_conninfo(rt), autocommit=True) as conn:
        return {pid for (pid,) in conn.execute("SELECT pid FROM event_listeners")}


def test_the_step_path_notifies_no_one_while_nobody_is_registered(
    runtime: Runtime, ear: psycopg.Connection[Any]
) -> None:
    job_id = _stored_and_run(runtime)

    assert str(job_id) not in _heard(runtime, ear)


def test_a_registered_listener_hears_a_job_stored_and_its_step_run(
    runtime: Runtime, ear: psycopg.Connection[Any]
) -> None:
    register(ear)
    job_id = _stored_and_run(runtime)

    assert str(job_id) in _heard(runtime, ear)
    unregister(ear)
    assert ear.info.backend_pid not in _registered(runtime)


def test_registering_waits_for_the_transactions_that_began_before_it(
    runtime: Runtime, ear: psycopg.Connection[Any]
) -> None:
    """A statement that began before the row was committed does not see it, and notifies no
    one: a reader that starts after ``register`` returns reads what it committed."""
    registered = threading.Event()

    def registering() -> None:
        register(ear)
        registered.set()

    with psycopg.connect(_conninfo(runtime)) as older:
        older.execute("SELECT 1")
        thread = threading.Thread(target=registering)
        thread.start()
        wait_for(lambda: ear.info.backend_pid in _registered(runtime), 10, "the listener's row")
        assert not registered.is_set(), "register returned while an older transaction was open"
        older.commit()
    thread.join(timeout=10)
    assert registered.is_set()


def test_registering_drops_the_rows_of_connections_that_are_gone(
    runtime: Runtime, ear: psycopg.Connection[Any]
) -> None:
    with psycopg.connect(_conninfo(runtime), autocommit=True) as conn:
        conn.execute("INSERT INTO event_listeners (pid) VALUES (%s)", (GONE_PID,))

    register(ear)

    assert _registered(runtime) == {ear.info.backend_pid}
