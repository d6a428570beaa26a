"""A PostgreSQL cluster and a Redis server of a bench's own, for the counters that are kept
per server: ``pg_stat_statements`` must be preloaded and the shared PostgreSQL's settings are
not ours to change, and Redis counts its commands for the whole server, which the shared one
serves to everybody on the machine.

The cluster is initdb'd in a temp dir with PostgreSQL's defaults but for the preload (fsync,
synchronous_commit, full_page_writes and the WAL settings stay as a production server starts
with them), listens on loopback on a free port, and is stopped and removed on exit. As root it
runs as the ``postgres`` user, which initdb requires.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
import redis

from bench.harness import free_port, log, subprocess_group

PG_BIN = Path(os.environ.get("BENCH_PG_BIN", "/usr/lib/postgresql/15/bin"))
MONITOR_ROLE = "bench_monitor"
"""The bench's own polling connects as this role, so its statements can be told apart."""
EXTENSIONS = ("pg_stat_statements", "pg_walinspect")


@dataclass(frozen=True)
class OwnPostgres:
    admin_url: str
    """SQLAlchemy URL of the cluster's ``postgres`` database, as the benches take it."""
    port: int
    data_dir: Path

    def conninfo(self, database: str = "postgres", user: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} dbname={database} user={user}"


def _as_postgres() -> list[str]:
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


def _run(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=120)
    if done.returncode:
        raise RuntimeError(f"{what} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")


@contextmanager
def own_postgres() -> Iterator[OwnPostgres]:
    root = Path(tempfile.mkdtemp(prefix="flowbeat-bench-pg-"))
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(root, user.pw_uid, user.pw_gid)
    data, port = root / "data", free_port()
    ctl = [*_as_postgres(), str(PG_BIN / "pg_ctl"), "-D", str(data)]
    try:
        initdb = [*_as_postgres(), str(PG_BIN / "initdb"), "-D", str(data)]
        _run([*initdb, "-U", "postgres", "--auth=trust", "-E", "UTF8"], "initdb")
        options = (
            f"-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={root} "
            "-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.max=10000"
        )
        _run([*ctl, "-l", str(root / "server.log"), "-w", "-t", "60", "-o", options, "start"], "pg")
        log(f"own PostgreSQL on port {port}, data in {data}")
        with psycopg.connect(f"host=127.0.0.1 port={port} user=postgres", autocommit=True) as c:
            for extension in EXTENSIONS:
                c.execute(f"CREATE EXTENSION {extension}")
            c.execute(f"CREATE ROLE {MONITOR_ROLE} LOGIN SUPERUSER")
        yield OwnPostgres(f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres", port, data)
    finally:
        if (data / "postmaster.pid").exists():
            _run([*ctl, "-m", "fast", "-w", "-t", "60", "stop"], "pg_ctl stop")
            log(f"stopped own PostgreSQL on port {port}")
        shutil.rmtree(root, ignore_errors=True)


@dataclass(frozen=True)
class OwnRedis:
    url: str
    """DB 1 of the server: the stack's broker."""
    pid: int

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_timeout=10)


@contextmanager
def own_redis(tmp: Path) -> Iterator[OwnRedis]:
    """No snapshots, no append-only file: the broker's commands are what is counted."""
    port = free_port()
    argv = [shutil.which("redis-server") or "redis-server", "--port", str(port)]
    argv += ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp)]
    with ExitStack() as stack:
        proc = stack.enter_context(
            subprocess_group(argv, dict(os.environ), tmp / "redis.log", "redis")
        )
        server = OwnRedis(f"redis://127.0.0.1:{port}/1", proc.pid)
        deadline = time.monotonic() + 30
        while True:
            try:
                if server.client().ping():
                    break
            except redis.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise
            time.sleep(0.05)
        yield server


def fdatasync_per_s(pg: OwnPostgres) -> float:
    """How many 8 kB write-and-fdatasync cycles a second the cluster's drive does, as
    ``pg_test_fsync`` measures it beside the data directory: a WAL flush's cost here."""
    target = pg.data_dir.parent / "fsync-test"
    argv = [*_as_postgres(), str(PG_BIN / "pg_test_fsync"), "-s", "2", "-f", str(target)]
    done = subprocess.run(argv, check=True, capture_output=True, text=True, timeout=120)
    for line in done.stdout.splitlines():
        fields = line.split()
        if fields[:1] == ["fdatasync"] and len(fields) > 1:
            return float(fields[1])
    raise RuntimeError(f"no fdatasync figure from pg_test_fsync:\n{done.stdout}")
