"""Real PostgreSQL and Redis for every test run: a fresh database and Redis DB per process."""

import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.servers import (
    DRILL_RUN_ENV,
    admin_database_url,
    allocate_redis_db,
    create_test_database,
    drop_counters,
    drop_test_database,
    held_db,
    redis_base_url,
    release_redis_db,
)

TESTS = Path(__file__).parent
TEST_PROFILES = TESTS / "profiles"
LOCAL_HOSTS = "127.0.0.1,::1,localhost"
"""The test servers (webhook receivers, replayed PubMed, files to download) listen here; the
stack opens them to the egress policy the way an operator opens an internal host."""


TIERS = ("unit", "e2e", "chaos", "cluster")
"""``make unit``, ``make e2e``, ``make chaos`` and ``make cluster`` select them by marker."""
STARTS_PROCESSES = ("drill", "install")
"""Markers of tests that start real processes: they are end-to-end wherever they live."""


def tier_of(item: pytest.Item) -> str:
    """A tier marked on the test, its module or its class wins; else ``tests/chaos`` is chaos,
    ``tests/cluster`` is cluster, ``tests/e2e`` and the process-starting markers are e2e, and
    everything else is unit (no processes: in-process API, engine, tasks and scheduler against
    PostgreSQL and Redis)."""
    for tier in TIERS:
        if item.get_closest_marker(tier) is not None:
            return tier
    parts = item.path.relative_to(TESTS).parts if item.path.is_relative_to(TESTS) else ()
    folder = parts[0] if len(parts) > 1 else ""
    if folder in ("chaos", "cluster"):
        return folder
    if folder == "e2e" or any(item.get_closest_marker(m) for m in STARTS_PROCESSES):
        return "e2e"
    return "unit"


def pytest_configure(config: pytest.Config) -> None:
    """A run started in the background (``make test &`` in a script) ignores SIGINT, and every
    command a test starts would inherit that: ``flowbeat dev`` stopped with SIGINT, as Ctrl-C
    stops it at a terminal, would never stop, and its worker would take later tests' jobs. A
    signal this process handles starts at its default in the commands it runs."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item)
        if item.get_closest_marker(tier) is None:
            item.add_marker(tier)


class Stack:
    """URLs and environment of one isolated test stack."""

    def __init__(self, database_url: str, broker_url: str, run: str) -> None:
        self.database_url = database_url
        self.broker_url = broker_url
        self.env = {
            "FLOWBEAT_DATABASE_URL": database_url,
            "FLOWBEAT_BROKER_URL": broker_url,
            "FLOWBEAT_PROFILES_DIR": str(TEST_PROFILES),
            "FLOWBEAT_ACTION_MODULES": "tests.drill_actions",
            "FLOWBEAT_LEASE_S": "3",
            "FLOWBEAT_VISIBILITY_TIMEOUT_S": "30",
            "FLOWBEAT_SWEEP_INTERVAL_S": "1",
            "FLOWBEAT_STALL_AFTER_S": "20",
            "FLOWBEAT_DISPATCH_GRACE_S": "2",
            "FLOWBEAT_WORKER_PREFETCH": "1",
            "FLOWBEAT_API_SHUTDOWN_GRACE_S": "1",
            "FLOWBEAT_EGRESS_ALLOW_HTTP": "true",
            "FLOWBEAT_EGRESS_INTERNAL_HOSTS": LOCAL_HOSTS,
            DRILL_RUN_ENV: run,
        }


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    owner = f"pytest-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    admin = admin_database_url()
    name = f"flowbeat_test_{uuid.uuid4().hex[:10]}"
    database_url = create_test_database(admin, name)
    base = redis_base_url()
    db = allocate_redis_db(base, owner)
    broker_url = f"{base.rsplit('/', 1)[0]}/{db}"
    from service.platform.migrate import upgrade

    upgrade(database_url)
    stack = Stack(database_url, broker_url, owner)
    saved = {key: os.environ.get(key) for key in stack.env}
    os.environ.update(stack.env)
    from service.platform.settings import get_settings

    get_settings.cache_clear()
    try:
        with held_db(base, db, owner):
            yield stack
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        get_settings.cache_clear()
        release_redis_db(base, db, owner)
        try:
            drop_counters(base, owner)
        finally:
            drop_test_database(admin, name)
