"""What every bench stands on: the chain profile, claimed Redis DBs, fresh PostgreSQL databases,
process groups and workers, py-spy, the temp workspace, and SIGTERM turned into an unwind."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import redis
from psycopg import sql

REPO = Path(__file__).resolve().parent.parent
DEFAULT_ADMIN_DB = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
DEFAULT_REDIS = "redis://127.0.0.1:6379/0"
CLAIM_PREFIX = "flowbeat-test:db:"  # the claims of tests/support/servers.py: we share the pool
CLAIM_TTL_S = 1800
PREFERRED_DBS = (13, 14)
FINAL = ("succeeded", "failed", "cancelled")
PIPELINE = "bench_chain"
PROFILE_YAML = f"""\
name: {PIPELINE}
description: three no-op steps in a chain, for bench.chain_throughput
steps:
  - id: a
    action: noop
  - id: b
    action: noop
    depends_on: [a]
  - id: c
    action: noop
    depends_on: [b]
"""
STEPS_PER_JOB = 3
A = TypeVar("A")
B = TypeVar("B")
RESULT_POLL_S = 1.0
WORKER_CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "2"))
WORKER_FLAGS = [
    "--without-gossip",
    "--without-mingle",
    "--without-heartbeat",
]

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


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Shared resources: Redis DB claims, a PostgreSQL database, subprocesses


def redis_db_url(base: str, number: int) -> str:
    scheme, _, rest = base.partition("?")[0].partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}/{number}"


@contextmanager
def claimed_redis_db(base: str, owner: str, taken: set[int], ttl_s: int) -> Iterator[int]:
    """Claim an empty Redis DB number (SET NX in db 0, as the tests do); flush and release it."""
    claims = redis.Redis.from_url(redis_db_url(base, 0), socket_timeout=10)
    order = [n for n in PREFERRED_DBS if n not in taken]
    order += [n for n in range(1, 16) if n not in order and n not in taken]
    number = None
    try:
        for candidate in order:
            key = f"{CLAIM_PREFIX}{candidate}"
            if not claims.set(key, owner, nx=True, ex=ttl_s):
                continue
            db = redis.Redis.from_url(redis_db_url(base, candidate), socket_timeout=10)
            try:
                empty = db.dbsize() == 0
            finally:
                db.close()
            if empty:
                number = candidate
                break
            claims.delete(key)  # someone's data lives there without a claim: leave it alone
        if number is None:
            raise RuntimeError("no free, empty Redis DB number in 1..15")
        taken.add(number)
        yield number
    finally:
        if number is not None:
            claims.eval(_RELEASE, 1, f"{CLAIM_PREFIX}{number}", owner, str(number))
        claims.close()


def flush_redis_db(base: str, number: int) -> None:
    """Each round starts from an empty DB: no results or queues left by the round before."""
    db = redis.Redis.from_url(redis_db_url(base, number), socket_timeout=10)
    try:
        db.flushdb()
    finally:
        db.close()


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


@contextmanager
def fresh_database(admin_url: str) -> Iterator[str]:
    name = f"bench_{secrets.token_hex(6)}"
    with psycopg.connect(_libpq(admin_url), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        base = admin_url.rsplit("/", 1)[0]
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(_libpq(admin_url), autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
        log(f"dropped database {name}")


@contextmanager
def subprocess_group(
    argv: list[str], env: dict[str, str], log_path: Path, name: str, cwd: Path = REPO
) -> Iterator[subprocess.Popen[bytes]]:
    """A child in its own session; TERM to it on exit, then KILL to whatever is left of its group
    (prefork pool processes included)."""
    out = log_path.open("wb")
    proc = subprocess.Popen(
        argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )
    log(f"started {name} pid {proc.pid} (log {log_path})")
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # stragglers of this group only
        out.close()
        log(f"stopped {name} pid {proc.pid} (exit {proc.returncode})")


def worker_argv(
    app_module: str,
    queue: str,
    node: str,
    pool: str = "prefork",
    concurrency: int = WORKER_CONCURRENCY,
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        app_module,
        "worker",
        f"--pool={pool}",
        f"--concurrency={concurrency}",
        *WORKER_FLAGS,
        "-Q",
        queue,
        "-n",
        node,
        "--loglevel=WARNING",
    ]


def wait_for_worker(
    celery_app: Any,
    node: str,
    proc: subprocess.Popen[bytes],
    log_path: Path,
    timeout_s: float = 60.0,
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"worker {node} exited ({proc.returncode}):\n{tail(log_path)}")
        if celery_app.control.ping(destination=[node], timeout=0.5):
            return
    raise RuntimeError(f"worker {node} did not answer a ping in {timeout_s}s:\n{tail(log_path)}")


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


@contextmanager
def py_spy(out_dir: Path | None, pid: int, name: str, gil: bool = False) -> Iterator[None]:
    """Sample ``pid`` and its children with py-spy while the timed section runs (optional).

    py-spy leaves out the threads it sees idle, but not one waiting in psycopg's C wait for a
    query's answer: 4 s of ``SELECT 1`` in a loop, 0.80 s of CPU by ``getrusage``, gave 645
    samples at 200/s (3.2 s), 58 % of them in ``Connection.wait``. ``gil`` keeps only the
    samples of a thread holding the GIL: 0.77 s of 1.08 s of CPU, 9 % in that wait. It misses
    the system calls and C code run without the GIL (socket I/O, libpq), but counts no wait."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if out_dir is None or not Path(exe).exists():
        if out_dir is not None:
            log("py-spy not found; not profiling")
        yield
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{name}.txt"
    argv = [
        exe,
        "record",
        "--subprocesses",
        "--nonblocking",
        *(["--gil"] if gil else []),
        "--format",
        "raw",
        "--rate",
        "200",
        "--output",
        str(target),
        "--pid",
        str(pid),
    ]
    spy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(0.5)
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        try:
            _, err = spy.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            spy.kill()
            _, err = spy.communicate()
        if spy.returncode not in (0, None) or not target.exists():
            log(f"py-spy {name}: exit {spy.returncode}: {err.decode(errors='replace')[-500:]}")
        else:
            log(f"py-spy {name}: {target}")


# --------------------------------------------------------------------------------------------
# A. raw Celery


@dataclass(frozen=True)
class Workspace:
    """What one bench run holds until its stack closes: a temp directory, the admin database
    URL, and one Redis DB per side."""

    tmp: Path
    admin_db: str
    redis_base: str
    dbs: tuple[int, int]

    def fresh_redis(self, side: int) -> str:
        """Side 0's or side 1's Redis DB, emptied, as a URL."""
        flush_redis_db(self.redis_base, self.dbs[side])
        return redis_db_url(self.redis_base, self.dbs[side])


def workspace(stack: ExitStack, bench: str, claim_ttl_s: int = CLAIM_TTL_S) -> Workspace:
    """``claim_ttl_s`` must outlast the bench: a claim that lapses is neither flushed nor
    released at the end, and another process may take the DB meanwhile."""
    redis_base = os.environ.get("FLOWBEAT_TEST_REDIS_URL", DEFAULT_REDIS)
    admin_db = os.environ.get("FLOWBEAT_TEST_DATABASE_URL", DEFAULT_ADMIN_DB)
    owner = f"bench-{bench}-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
    tmp = Path(tempfile.mkdtemp(prefix="flowbeat-bench-"))
    stack.callback(shutil.rmtree, tmp, True)
    taken: set[int] = set()
    dbs = tuple(
        stack.enter_context(claimed_redis_db(redis_base, owner, taken, claim_ttl_s)) for _ in "ab"
    )
    log(f"Redis DBs: A={dbs[0]} B={dbs[1]}; temp dir {tmp}")
    return Workspace(tmp, admin_db, redis_base, (dbs[0], dbs[1]))


def on_sigterm(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds the ExitStacks: processes, database, Redis DBs
