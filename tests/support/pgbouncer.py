"""PgBouncer in transaction pooling mode in front of a test database, as a deployment puts it
between every flowbeat process and PostgreSQL (Debian's package; ``.ci/run`` installs it)."""

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row
from sqlalchemy import make_url

PGBOUNCER = Path("/usr/sbin/pgbouncer")
SERVER_CONNECTIONS = 2
"""Few server connections for many clients: every transaction may land on another one, as
under load in production, so anything left on a connection is found missing."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _config(database_url: str, folder: Path, port: int) -> str:
    url = make_url(database_url)
    host = url.host or "/var/run/postgresql"
    lines = [
        "[databases]",
        f"* = host={host} port={url.port or 5432}",
        "[pgbouncer]",
        "listen_addr = 127.0.0.1",
        f"listen_port = {port}",
        "unix_socket_dir =",
        "auth_type = trust",
        f"auth_file = {folder / 'users.txt'}",
        "pool_mode = transaction",
        f"default_pool_size = {SERVER_CONNECTIONS}",
        "max_client_conn = 500",
        f"admin_users = {url.username}",
        f"logfile = {folder / 'pgbouncer.log'}",
        f"pidfile = {folder / 'pgbouncer.pid'}",
    ]
    if os.geteuid() == 0:
        lines.append("user = postgres")  # PgBouncer refuses to run as root
    return "\n".join(lines) + "\n"


def admin(url: str, command: str) -> dict[str, dict[str, Any]]:
    """A ``SHOW`` on PgBouncer's admin console, each row by its database, as column: value."""
    console = make_url(url).set(drivername="postgresql", database="pgbouncer")
    with (
        psycopg.connect(console.render_as_string(False), autocommit=True) as conn,
        conn.cursor(row_factory=dict_row) as cursor,
    ):
        rows = cursor.execute(command, prepare=False).fetchall()
    return {str(row["database"]): row for row in rows}


@contextmanager
def pgbouncer(database_url: str) -> Iterator[str]:
    """PgBouncer in front of ``database_url``'s server; yields the URL of the same database
    through it. Its folder is its own (not pytest's, which only root may enter)."""
    folder = Path(tempfile.mkdtemp(prefix="flowbeat-pgbouncer-"))
    port = _free_port()
    user = make_url(database_url).username or "postgres"
    (folder / "users.txt").write_text(f'"{user}" ""\n')
    ini = folder / "pgbouncer.ini"
    ini.write_text(_config(database_url, folder, port))
    if os.geteuid() == 0:
        postgres = pwd.getpwnam("postgres")
        for path in [folder, *folder.iterdir()]:
            os.chown(path, postgres.pw_uid, postgres.pw_gid)
    quiet = subprocess.DEVNULL
    proc = subprocess.Popen([str(PGBOUNCER), str(ini)], stdout=quiet, stderr=quiet)
    through = make_url(database_url).set(host="127.0.0.1", port=port)
    try:
        _wait_listening(port, proc, folder)
        yield through.render_as_string(False)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)


def _wait_listening(port: int, proc: "subprocess.Popen[bytes]", folder: Path) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log = folder / "pgbouncer.log"
            raise AssertionError(f"pgbouncer exited: {log.read_text() if log.exists() else ''}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError("pgbouncer did not listen within 10 s")
