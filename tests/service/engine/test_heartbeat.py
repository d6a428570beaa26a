"""A lease held by a worker that cannot reach PostgreSQL is given up once it would have lapsed."""

import threading
import time
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.orm import Session

from service.engine.heartbeat import Heartbeats
from service.engine.runtime import Runtime
from service.platform.db import make_engine, make_session_factory

LEASE_S = 0.6
UNREACHABLE = "postgresql+psycopg://postgres@127.0.0.1:1/flowbeat?connect_timeout=1"


def _kept(session: Session, lease_s: float, now: datetime) -> bool:
    return session.execute(text("SELECT true")).scalar_one() is True


def test_a_lease_that_cannot_be_renewed_is_lost_once_it_would_have_lapsed() -> None:
    beats = Heartbeats(make_session_factory(make_engine(UNREACHABLE)), LEASE_S)
    lost = threading.Event()
    started = time.monotonic()
    with beats.hold_lease(_kept, lost):
        assert lost.wait(timeout=10 * LEASE_S)
    assert time.monotonic() - started >= LEASE_S


def test_a_lease_renewed_in_time_is_kept_past_its_length(runtime: Runtime) -> None:
    beats = Heartbeats(runtime.sessions, LEASE_S)
    lost = threading.Event()
    with beats.hold_lease(_kept, lost):
        assert not lost.wait(timeout=3 * LEASE_S)


def test_a_lease_whose_renewal_never_comes_back_is_lost_once_it_would_have_lapsed(
    runtime: Runtime,
) -> None:
    """As a renewal sent on a connection whose packets a partition drops: the statement
    neither answers nor fails, and the step must not run on past its lease meanwhile."""
    beats = Heartbeats(runtime.sessions, LEASE_S)
    lost, stuck = threading.Event(), threading.Event()

    def hung(session: Session, lease_s: float, now: datetime) -> bool:
        stuck.wait(timeout=30)
        return True

    started = time.monotonic()
    try:
        with beats.hold_lease(hung, lost):
            assert lost.wait(timeout=10 * LEASE_S)
        assert LEASE_S <= time.monotonic() - started < 5 * LEASE_S
    finally:
        stuck.set()


def _lost(session: Session, lease_s: float, now: datetime) -> bool:
    return False


def test_a_step_still_running_a_tick_after_it_was_told_is_stopped_once(
    runtime: Runtime,
) -> None:
    beats = Heartbeats(runtime.sessions, LEASE_S)
    lost, stopped, stops = threading.Event(), threading.Event(), []

    def stop() -> None:
        stops.append(1)
        stopped.set()

    with beats.hold_lease(_lost, lost, stop):
        assert lost.wait(timeout=10 * LEASE_S)
        assert stopped.wait(timeout=10 * LEASE_S)
        time.sleep(3 * LEASE_S)
    assert stops == [1]


def test_a_step_that_heeds_being_told_is_not_stopped(runtime: Runtime) -> None:
    beats = Heartbeats(runtime.sessions, LEASE_S)
    lost, stopped = threading.Event(), threading.Event()
    with beats.hold_lease(_lost, lost, stopped.set):
        assert lost.wait(timeout=10 * LEASE_S)
    assert not stopped.wait(timeout=3 * LEASE_S)
