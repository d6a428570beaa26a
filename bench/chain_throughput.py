"""Persisted step throughput of flowbeat against raw Celery running the same no-op chain.

    python -m bench.chain_throughput --jobs 1000 [--json] [--py-spy DIR]

One run, one machine, one Redis server, the same worker settings for both sides (prefork,
``--concurrency 2``, or ``BENCH_CONCURRENCY``; the prefetch multiplier of
``Settings.worker_prefetch``), one worker at a time so each side has every core:

A. raw Celery (``bench.raw_app``): N chains ``noop.si() | noop.si() | noop.si()``; the client
   waits on the AsyncResult of each chain's last task. tasks/s = 3N / (first submit .. last result).
B. flowbeat: a fresh PostgreSQL database, the API under uvicorn and a worker as subprocesses,
   N jobs of a 3-step chain profile (a -> b -> c, ``noop`` actions) POSTed to ``/v1/jobs`` by a
   few client threads; the database is polled until every job is final.
   persisted steps/s = 3N / (first POST .. last job final). Enqueue latency p50/p99 and rate too.

Each side first runs a short warm-up (not timed) so imports, connection pools and the pool
processes are hot. Everything started here (processes, the database, the Redis DBs, the temp
directory) is removed on the way out, failures and SIGTERM included.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
import psycopg
import redis
from psycopg import sql

from bench.cpu import CpuMeter, descendants

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
    "--pool=prefork",
    f"--concurrency={WORKER_CONCURRENCY}",
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
    argv: list[str], env: dict[str, str], log_path: Path, name: str
) -> Iterator[subprocess.Popen[bytes]]:
    """A child in its own session; TERM to it on exit, then KILL to whatever is left of its group
    (prefork pool processes included)."""
    out = log_path.open("wb")
    proc = subprocess.Popen(
        argv, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
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


def worker_argv(app_module: str, queue: str, node: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        app_module,
        "worker",
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
def py_spy(out_dir: Path | None, pid: int, name: str) -> Iterator[None]:
    """Sample ``pid`` and its children with py-spy while the timed section runs (optional)."""
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


@dataclass
class RawResult:
    chains: int
    tasks: int
    submit_s: float
    wall_s: float
    tasks_per_s: float
    cpu_ms_per_chain: dict[str, float] = field(default_factory=dict)


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


@contextmanager
def raw_worker(
    redis_url: str, tmp: Path, workers: int = 1
) -> Iterator[tuple[Any, subprocess.Popen[bytes]]]:
    """``bench.raw_app`` bound to ``redis_url`` and ``workers`` worker processes, started and
    answering (the first is yielded); they are stopped on exit."""
    os.environ["BENCH_RAW_REDIS_URL"] = redis_url  # read by bench.raw_app at import
    from bench import raw_app

    env = {**os.environ, "BENCH_RAW_REDIS_URL": redis_url, "PYTHONPATH": str(REPO)}
    with ExitStack() as stack:
        procs = []
        for index in range(workers):
            node = f"bench-raw-{os.getpid()}-{index}@{socket.gethostname()}"
            log_path = tmp / f"raw-worker-{index}.log"
            argv = worker_argv("bench.raw_app", raw_app.QUEUE, node)
            proc = stack.enter_context(subprocess_group(argv, env, log_path, "raw celery worker"))
            wait_for_worker(raw_app.app, node, proc, log_path)
            procs.append(proc)
        yield raw_app, procs[0]


def wait_results(results: list[Any], deadline: float) -> tuple[float, int]:
    """When the last chain finished (epoch seconds), and how many results were read from
    the backend because their pubsub message never came: Celery 5.7's Redis result
    consumer occasionally misses one, and ``get()`` would then wait forever. Such a
    chain counts as finished at its ``date_done``, so the stall costs raw Celery nothing."""
    from celery.exceptions import TimeoutError as CeleryTimeout

    last, rescued = 0.0, 0
    for result in results:
        while True:
            try:
                result.get(timeout=RESULT_POLL_S, propagate=True)
                last = max(last, time.time())
                break
            except CeleryTimeout:
                if result.ready():
                    rescued += 1
                    last = max(last, _epoch(result.date_done))
                    break
                if time.monotonic() > deadline:
                    raise
    return last, rescued


def run_raw(
    n: int,
    warmup: int,
    redis_url: str,
    tmp: Path,
    timeout_s: float,
    workers: int = 1,
    spy_dir: Path | None = None,
) -> RawResult:
    from celery import chain

    with raw_worker(redis_url, tmp, workers) as (raw_app, proc):
        noop = raw_app.noop

        def submit(count: int) -> list[Any]:
            return [chain(noop.si(), noop.si(), noop.si()).apply_async() for _ in range(count)]

        if warmup:
            wait_results(submit(warmup), time.monotonic() + timeout_s)
        log(f"A: submitting {n} chains of {STEPS_PER_JOB} no-op tasks")
        meter = CpuMeter({"workers": descendants(os.getpid())})
        with py_spy(spy_dir, proc.pid, "raw-worker"):
            meter.start()
            t0 = time.time()
            results = submit(n)
            t_submitted = time.time()
            t1, rescued = wait_results(results, time.monotonic() + timeout_s)
            cpu = meter.stop()
    if rescued:
        log(f"A: {rescued} results read from the backend after their pubsub message was missed")
    wall = t1 - t0
    per_chain = {part: s * 1000 / n for part, s in cpu.items()}
    return RawResult(
        n, STEPS_PER_JOB * n, t_submitted - t0, wall, STEPS_PER_JOB * n / wall, per_chain
    )


def _epoch(moment: datetime | str) -> float:
    parsed = moment if isinstance(moment, datetime) else datetime.fromisoformat(moment)
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()


# --------------------------------------------------------------------------------------------
# B. flowbeat


@dataclass
class FlowbeatResult:
    jobs: int
    steps: int
    wall_s: float
    steps_per_s: float
    enqueue_wall_s: float
    enqueue_rate_jobs_per_s: float
    enqueue_p50_ms: float
    enqueue_p99_ms: float
    enqueue_max_ms: float
    http_errors: int
    succeeded: int
    not_succeeded: dict[str, int] = field(default_factory=dict)
    cpu_ms_per_job: dict[str, float] = field(default_factory=dict)


def _count_final(conn: psycopg.Connection[Any]) -> dict[str, int]:
    rows = conn.execute(
        "SELECT status, count(*) FROM jobs WHERE status = ANY(%s) GROUP BY status", (list(FINAL),)
    ).fetchall()
    return {status: count for status, count in rows}


def wait_final(
    conn: psycopg.Connection[Any],
    total: int,
    deadline: float,
    stop: Callable[[], bool] = lambda: False,
) -> dict[str, int]:
    while True:
        counts = _count_final(conn)
        if sum(counts.values()) >= total:
            return counts
        if time.monotonic() > deadline or stop():
            raise TimeoutError(f"only {counts} of {total} jobs final")
        time.sleep(0.05)


def post_jobs(
    base_url: str, key: str, count: int, threads: int, latencies: list[float], errors: list[str]
) -> None:
    """``count`` POSTs spread over ``threads`` clients, each with its own keep-alive connection.

    The load generator shares the cores with what it measures, so it is the standard library's
    ``http.client``: a quarter of the CPU per request of a full-featured client such as httpx.
    """
    counter = iter(range(count))
    lock = threading.Lock()
    body = json.dumps({"pipeline": PIPELINE, "params": {}}).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    address = urlsplit(base_url)

    def client_loop() -> None:
        conn = http.client.HTTPConnection(address.hostname or "", address.port, timeout=60.0)
        try:
            while True:
                with lock:
                    if next(counter, None) is None:
                        return
                started = time.perf_counter()
                try:
                    conn.request("POST", "/v1/jobs", body=body, headers=headers)
                    response = conn.getresponse()
                    text = response.read()
                    elapsed = time.perf_counter() - started
                except (OSError, http.client.HTTPException) as exc:
                    errors.append(repr(exc))
                    conn.close()
                    continue
                if response.status != 202:
                    errors.append(f"{response.status} {text[:200]!r}")
                else:
                    latencies.append(elapsed)
        finally:
            conn.close()

    with ThreadPoolExecutor(max_workers=threads) as pool:
        for future in [pool.submit(client_loop) for _ in range(threads)]:
            future.result()


EVENT_TRIGGERS = {
    "jobs": ("jobs_created_event", "jobs_status_event"),
    "step_runs": ("step_runs_status_event", "step_runs_created_event"),
}
"""The event log's triggers on the rows a chain changes (migration 0011)."""


def disable_event_log(db_url: str) -> None:
    """For measuring only, never a way to run: what flowbeat costs with no event appended,
    the most any cheaper event log could save. Streams and run history read the log."""
    with psycopg.connect(_libpq(db_url), autocommit=True) as conn:
        for table, triggers in EVENT_TRIGGERS.items():
            for trigger in triggers:
                conn.execute(
                    sql.SQL("ALTER TABLE {} DISABLE TRIGGER {}").format(
                        sql.Identifier(table), sql.Identifier(trigger)
                    )
                )


def _database_with_key(
    stack: ExitStack, admin_db: str, without_event_log: bool = False
) -> tuple[str, str]:
    """A fresh, migrated database (dropped when ``stack`` closes) and an admin API key in it."""
    from service.platform.auth import create_api_key
    from service.platform.db import make_engine, make_session_factory, unit_of_work
    from service.platform.migrate import upgrade

    db_url = stack.enter_context(fresh_database(admin_db))
    log("B: migrating")
    upgrade(db_url)
    if without_event_log:
        disable_event_log(db_url)
    engine = make_engine(db_url, pool_size=1)
    try:
        with unit_of_work(make_session_factory(engine)) as session:
            key, _ = create_api_key(session, owner="bench", scopes=["admin"])
    finally:
        engine.dispose()
    return db_url, key


def _start_api(
    stack: ExitStack, env: dict[str, str], tmp: Path
) -> tuple[subprocess.Popen[bytes], str]:
    """The API as deployments start it (``flowbeat api``: uvicorn, an access log line for each
    request), as a subprocess; returns once /health answers 200."""
    port = free_port()
    api_argv = [sys.executable, "-m", "service.cli", "api"]
    api_argv += ["--host", "127.0.0.1", "--port", str(port)]
    api_log = tmp / "api.log"
    api_proc = stack.enter_context(subprocess_group(api_argv, env, api_log, "flowbeat api"))
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        if api_proc.poll() is not None:
            raise RuntimeError(f"API exited ({api_proc.returncode}):\n{tail(api_log)}")
        try:
            if httpx.get(f"{base_url}/health", timeout=2).status_code == 200:
                return api_proc, base_url
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"API not healthy in 60s:\n{tail(api_log)}")
        time.sleep(0.2)


@dataclass
class FlowbeatStack:
    """A fresh database with an admin key, the API and one worker, all started for one side."""

    base_url: str
    key: str
    conn: psycopg.Connection[Any]
    api: subprocess.Popen[bytes]
    workers: list[subprocess.Popen[bytes]]
    api_log: Path
    worker_log: Path
    env: dict[str, str]

    @property
    def worker(self) -> subprocess.Popen[bytes]:
        return self.workers[0]

    def dead(self) -> bool:
        return self.api.poll() is not None or any(w.poll() is not None for w in self.workers)


def start_flowbeat(
    stack: ExitStack,
    profiles: dict[str, str],
    redis_url: str,
    admin_db: str,
    tmp: Path,
    settings: dict[str, str] | None = None,
    workers: int = 1,
    without_event_log: bool = False,
) -> FlowbeatStack:
    """Everything is stopped and dropped when ``stack`` closes. ``profiles`` maps a name to
    the YAML of a profile the API serves as shipped; each is validated here first.
    ``settings`` are extra ``FLOWBEAT_*`` variables for every process. The per-key request
    limit and the open-jobs cap are off: a bench sends as fast as the API answers. The
    first of ``workers`` worker processes logs to ``worker_log``, the others beside it."""
    from celery import Celery

    from service.language.loading import load_profile_file
    from service.platform.constants import QUEUE_CONTROL, QUEUE_STEPS

    profiles_dir = tmp / "profiles"
    profiles_dir.mkdir(exist_ok=True)
    for name, text in profiles.items():
        (profiles_dir / f"{name}.yaml").write_text(text)
        load_profile_file(profiles_dir / f"{name}.yaml")
    db_url, key = _database_with_key(stack, admin_db, without_event_log)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("FLOWBEAT_")},
        "FLOWBEAT_DATABASE_URL": db_url,
        "FLOWBEAT_BROKER_URL": redis_url,
        "FLOWBEAT_PROFILES_DIR": str(profiles_dir),
        "FLOWBEAT_DATA_DIR": str(tmp / "data"),
        "PYTHONPATH": str(REPO),
        "FLOWBEAT_RATE_LIMIT_PER_S": "0",
        "FLOWBEAT_MAX_OPEN_JOBS_PER_OWNER": "0",
        **(settings or {}),
    }
    api_proc, base_url = _start_api(stack, env, tmp)
    control = Celery("bench-control", broker=redis_url)
    stack.callback(control.close)
    procs = []
    for index in range(workers):
        node = f"bench-flowbeat-{os.getpid()}-{index}@{socket.gethostname()}"
        log_path = tmp / ("flowbeat-worker.log" if index == 0 else f"flowbeat-worker-{index}.log")
        argv = worker_argv("tasks.app", f"{QUEUE_STEPS},{QUEUE_CONTROL}", node)
        proc = stack.enter_context(subprocess_group(argv, env, log_path, "flowbeat worker"))
        wait_for_worker(control, node, proc, log_path)
        procs.append(proc)
    conn = stack.enter_context(psycopg.connect(_libpq(db_url), autocommit=True))
    worker_log = tmp / "flowbeat-worker.log"
    return FlowbeatStack(base_url, key, conn, api_proc, procs, tmp / "api.log", worker_log, env)


def run_flowbeat(
    n: int,
    warmup: int,
    threads: int,
    redis_url: str,
    admin_db: str,
    tmp: Path,
    timeout_s: float,
    spy_dir: Path | None,
    workers: int = 1,
    without_event_log: bool = False,
) -> FlowbeatResult:
    with ExitStack() as stack:
        profiles = {PIPELINE: PROFILE_YAML}
        fb = start_flowbeat(
            stack,
            profiles,
            redis_url,
            admin_db,
            tmp,
            workers=workers,
            without_event_log=without_event_log,
        )
        if warmup:
            errors: list[str] = []
            post_jobs(fb.base_url, fb.key, warmup, min(threads, warmup), [], errors)
            if errors:
                raise RuntimeError(f"warm-up POSTs failed: {errors[:3]}\n{tail(fb.api_log)}")
            wait_final(fb.conn, warmup, time.monotonic() + timeout_s, fb.dead)

        log(f"B: POSTing {n} jobs of {STEPS_PER_JOB} no-op steps with {threads} client threads")
        latencies: list[float] = []
        errors = []
        with ExitStack() as spies:
            spies.enter_context(py_spy(spy_dir, fb.worker.pid, "flowbeat-worker"))
            spies.enter_context(py_spy(spy_dir, fb.api.pid, "flowbeat-api"))
            roots = {"api": [fb.api.pid], "workers": [w.pid for w in fb.workers]}
            meter = CpuMeter(roots, fb.conn)
            meter.start()
            t0 = time.perf_counter()
            args = (fb.base_url, fb.key, n, threads, latencies, errors)
            poster = threading.Thread(target=post_jobs, args=args, daemon=True)
            poster.start()
            poster.join()
            t_posted = time.perf_counter()
            total = warmup + len(latencies)
            counts = wait_final(fb.conn, total, time.monotonic() + timeout_s, fb.dead)
            t1 = time.perf_counter()
            cpu = meter.stop()
        if errors:
            log(f"B: {len(errors)} POSTs failed, e.g. {errors[0]}")
        if fb.dead() or any(status != "succeeded" for status in counts):
            log(f"worker log:\n{tail(fb.worker_log)}")
        result = _flowbeat_result(latencies, len(errors), counts, warmup, t1 - t0, t_posted - t0)
        result.cpu_ms_per_job = {part: s * 1000 / max(result.jobs, 1) for part, s in cpu.items()}
        return result


def _flowbeat_result(
    latencies: list[float],
    http_errors: int,
    counts: dict[str, int],
    warmup: int,
    wall: float,
    enqueue_wall: float,
) -> FlowbeatResult:
    accepted = len(latencies)
    lat_ms = [x * 1000 for x in latencies]
    not_ok = {s: c for s, c in counts.items() if s != "succeeded" and c}
    if not_ok:
        log(f"B: jobs not succeeded: {not_ok}")
    return FlowbeatResult(
        jobs=accepted,
        steps=STEPS_PER_JOB * accepted,
        wall_s=wall,
        steps_per_s=STEPS_PER_JOB * accepted / wall,
        enqueue_wall_s=enqueue_wall,
        enqueue_rate_jobs_per_s=accepted / enqueue_wall,
        enqueue_p50_ms=pct(lat_ms, 0.50),
        enqueue_p99_ms=pct(lat_ms, 0.99),
        enqueue_max_ms=max(lat_ms) if lat_ms else float("nan"),
        http_errors=http_errors,
        succeeded=counts.get("succeeded", 0) - warmup,
        not_succeeded=not_ok,
    )


# --------------------------------------------------------------------------------------------


@dataclass
class Round:
    raw: RawResult | None
    fb: FlowbeatResult | None
    before: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    disturbed: bool = False

    @property
    def ratio(self) -> float | None:
        return self.fb.steps_per_s / self.raw.tasks_per_s if self.raw and self.fb else None

    @property
    def cpu_ratio(self) -> float | None:
        """Raw Celery's CPU per chain over flowbeat's per job: the throughput ratio the two
        sides would reach if CPU were the only limit, however busy the machine was."""
        if not (self.raw and self.fb and self.raw.cpu_ms_per_chain and self.fb.cpu_ms_per_job):
            return None
        return sum(self.raw.cpu_ms_per_chain.values()) / sum(self.fb.cpu_ms_per_job.values())


def run_round(
    number: int,
    only: str | None,
    side_a: Callable[[], RawResult],
    side_b: Callable[[], FlowbeatResult],
) -> Round:
    """Odd rounds run flowbeat first, so a machine that speeds up or slows down during the run
    favours neither side. The machine is calibrated before and after the round."""
    before = calibrate()
    raw: RawResult | None
    fb: FlowbeatResult | None
    if only is None:
        raw, fb = alternate(number, side_a, side_b)
    else:
        raw = side_a() if only == "raw" else None
        fb = side_b() if only == "flowbeat" else None
    return Round(raw, fb, before, calibrate())


def alternate(number: int, side_a: Callable[[], A], side_b: Callable[[], B]) -> tuple[A, B]:
    """Both sides of round ``number``, B first in odd rounds."""
    if number % 2:
        b = side_b()
        return side_a(), b
    a = side_a()
    return a, side_b()


DISTURBED_SLOWDOWN = 1.25


def mark_disturbed(rounds: list[Round]) -> None:
    """A round whose calibration loop ran more than ``DISTURBED_SLOWDOWN`` times slower, before
    or after it, than the fastest loop of the run (a throttled VM), or with something else
    keeping more than ``BUSY_CORES_DISTURBED`` of a core busy while the bench was idle (a
    shared machine), is reported, but left out of the median."""
    if not rounds:
        return
    best = min(min(r.before["loop_ms"], r.after["loop_ms"]) for r in rounds)
    for r in rounds:
        r.disturbed = disturbed(r.before, r.after, best)


def disturbed(before: dict[str, float], after: dict[str, float], best_loop_ms: float) -> bool:
    """One round's calibrations against the fastest loop of its run (``mark_disturbed``)."""
    slowest = max(before["loop_ms"], after["loop_ms"])
    busy = max(before["background_cores"], after["background_cores"])
    return slowest > DISTURBED_SLOWDOWN * best_loop_ms or busy > BUSY_CORES_DISTURBED


def median_round(rounds: list[Round]) -> Round | None:
    """The round whose ratio is the median (the lower middle one for an even count) of the
    undisturbed rounds, or of all when every round was disturbed."""
    clean = [r for r in rounds if not r.disturbed] or rounds
    if not clean:
        return None
    ranked = sorted(
        clean,
        key=lambda r: (
            r.ratio if r.ratio is not None else 0.0,
            r.raw.tasks_per_s if r.raw else 0.0,
            r.fb.steps_per_s if r.fb else 0.0,
        ),
    )
    return ranked[(len(ranked) - 1) // 2]


CALIBRATION_LOOP = 2_000_000
TARGET_RATIO = 0.90


BACKGROUND_SAMPLE_S = 1.0
BUSY_CORES_DISTURBED = 0.3


def _cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot, from /proc/stat (0, 0 where there is none)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields[:8]) - idle, sum(fields[:8])


def background_cores() -> float:
    """Cores kept busy by something else while this bench is idle, over a short sample."""
    busy0, total0 = _cpu_jiffies()
    time.sleep(BACKGROUND_SAMPLE_S)
    busy1, total1 = _cpu_jiffies()
    if total1 == total0:
        return 0.0
    return (busy1 - busy0) / (total1 - total0) * (os.cpu_count() or 1)


def calibrate() -> dict[str, float]:
    """How fast this machine runs a fixed pure-Python loop right now (best of three), how
    many cores something else keeps busy, and the load: the VM's speed drifts and the
    machine may be shared, so a run is read against its own calibration."""
    times = []
    for _ in range(3):
        started = time.perf_counter()
        sum(i * i for i in range(CALIBRATION_LOOP))
        times.append(time.perf_counter() - started)
    return {
        "loop_ms": min(times) * 1000,
        "background_cores": background_cores(),
        "load_1m": os.getloadavg()[0],
    }


PACE_FILE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flowbeat-bench.json"
"""The fastest calibration loop each kind of machine and interpreter has run, kept between runs."""
SHIPPED_PACES = Path(__file__).with_name("paces.json")
"""The fastest loops measured on the machines these benches were run on, for a machine that
has no history of its own: every session here starts on a fresh VM, so its first run would
otherwise become the reference however slow the VM was running then."""


def machine_pace(rounds_loop_ms: list[float]) -> dict[str, float]:
    """This run's fastest calibration loop against the fastest that any earlier run on this
    kind of machine (CPU model and count), with this interpreter, recorded in ``PACE_FILE`` or
    ``SHIPPED_PACES``; the run's own when none did.

    A round is marked disturbed against the run's own fastest loop, so a run that is slow
    from start to end has no disturbed round: only this says it ran on a throttled machine.
    """
    key = pace_key()
    known = _paces(PACE_FILE)
    run_ms = min(rounds_loop_ms)
    fastest = min(
        [run_ms] + [paces[key] for paces in (known, _paces(SHIPPED_PACES)) if key in paces]
    )
    with suppress(OSError):
        PACE_FILE.parent.mkdir(parents=True, exist_ok=True)
        PACE_FILE.write_text(json.dumps({**known, key: fastest}, indent=2))
    return {"run_loop_ms": run_ms, "fastest_loop_ms": fastest, "slowdown": run_ms / fastest}


def pace_key() -> str:
    return f"{_cpu_model()}, {os.cpu_count()} cpus: {interpreter()}"


def _cpu_model() -> str:
    with suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() == "model name":
                return value.strip()
    return platform.processor() or platform.machine()


def _paces(path: Path) -> dict[str, float]:
    try:
        found: dict[str, float] = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found


def pace_line(pace: dict[str, float]) -> str:
    slowdown = pace["slowdown"]
    if slowdown > DISTURBED_SLOWDOWN:
        verdict = "a throttled machine: a figure that needs its usual speed is not clean"
    elif slowdown <= 1:
        verdict = "the fastest this kind of machine has run"
    else:
        verdict = "within the recorded pace"
    return (
        f"  machine pace: the run's fastest calibration loop {pace['run_loop_ms']:.0f} ms, "
        f"{slowdown:.2f} times the fastest recorded for this kind of machine and interpreter "
        f"({pace['fastest_loop_ms']:.0f} ms; {SHIPPED_PACES.name} and {PACE_FILE}): {verdict}"
    )


def interpreter() -> str:
    """Every figure here moves by a tenth or more with the interpreter's build: Debian's
    python3.11 and the image's python:3.11-slim are built with PGO and LTO, a default pyenv
    build with neither, and with libpython as a shared library."""
    return (
        f"{platform.python_implementation()} {platform.python_version()}, "
        f"{os.path.realpath(sys.executable)}, libpython {_libpython()}"
    )


def _libpython() -> str:
    """Linked in or loaded as a shared library: what the process maps, not what sysconfig
    says (Debian builds the shared library too, but links its interpreter statically)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "unknown"
    return "shared" if "libpython" in maps else "static"


def _round_line(r: Round) -> str:
    figures = (
        f"{r.raw.tasks_per_s:.0f}/{r.fb.steps_per_s:.0f}={r.ratio:.2f}"
        if r.raw and r.fb and r.ratio is not None
        else "-"
    )
    machine = (
        f"loop {r.before['loop_ms']:.0f}/{r.after['loop_ms']:.0f} ms, "
        f"background {r.before['background_cores']:.2f}/{r.after['background_cores']:.2f} "
        f"cores, load {r.before['load_1m']:.2f}/{r.after['load_1m']:.2f}"
    )
    cpu = f", CPU ratio {r.cpu_ratio:.2f}" if r.cpu_ratio is not None else ""
    return f"    {figures}{cpu} ({machine}){' DISTURBED' if r.disturbed else ''}"


def _cpu_line(name: str, parts: dict[str, float]) -> str:
    each = ", ".join(f"{part} {ms:.2f}" for part, ms in parts.items())
    return f"    {name}: {sum(parts.values()):.2f} ms ({each})"


def report(
    args: argparse.Namespace, rounds: list[Round], calibration: dict[str, dict[str, float]]
) -> int:
    """Print the median round's figures (and every round's ratio); non-zero if any job failed."""
    mark_disturbed(rounds)
    middle = median_round(rounds)
    raw, fb = (middle.raw, middle.fb) if middle else (None, None)
    ratio = middle.ratio if middle else None
    from service.platform.settings import Settings

    pace = machine_pace(
        [ms for r in rounds for ms in (r.before["loop_ms"], r.after["loop_ms"])]
        or [calibration["before"]["loop_ms"]]
    )
    figures = {
        "machine": {"cpus": os.cpu_count(), "python": interpreter(), "pace": pace},
        "worker": {
            "pool": "prefork",
            "processes": args.workers,
            "concurrency": WORKER_CONCURRENCY,
            "prefetch_multiplier": Settings().worker_prefetch,
        },
        "jobs": args.jobs,
        "clients": args.clients,
        "without_event_log": args.without_event_log,
        "raw_celery": asdict(raw) if raw else None,
        "flowbeat": asdict(fb) if fb else None,
        "ratio": ratio,
        "cpu_ratio_median": _median_cpu_ratio(rounds),
        "rounds": [
            {
                "ratio": r.ratio,
                "cpu_ratio": r.cpu_ratio,
                "before": r.before,
                "after": r.after,
                "disturbed": r.disturbed,
            }
            for r in rounds
        ],
        "target_ratio": TARGET_RATIO,
        "calibration": calibration,
    }
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        _print_report(args, rounds, calibration, middle)
        print(pace_line(pace))
    failed = [r.fb for r in rounds if r.fb and (r.fb.http_errors or r.fb.not_succeeded)]
    for bad in failed:
        print(f"  problems: {bad.http_errors} POST errors, not succeeded: {bad.not_succeeded}")
    return 1 if failed else 0


def _median_cpu_ratio(rounds: list[Round]) -> float | None:
    ratios = sorted(r.cpu_ratio for r in rounds if r.cpu_ratio is not None)
    return ratios[(len(ratios) - 1) // 2] if ratios else None


def _print_report(
    args: argparse.Namespace,
    rounds: list[Round],
    calibration: dict[str, dict[str, float]],
    middle: Round | None,
) -> None:
    raw, fb = (middle.raw, middle.fb) if middle else (None, None)
    ratio = middle.ratio if middle else None
    print()
    print(
        f"chain throughput, {args.jobs} chains of {STEPS_PER_JOB} no-op steps, "
        f"{args.workers} prefork worker(s) of concurrency {WORKER_CONCURRENCY}, "
        f"{os.cpu_count()} cpus, {interpreter()}"
        + (", flowbeat WITHOUT its event log" if args.without_event_log else "")
    )
    x = f"{raw.tasks_per_s:.0f}" if raw else "-"
    y = f"{fb.steps_per_s:.0f}" if fb else "-"
    r = f"{ratio:.2f}" if ratio is not None else "-"
    print(
        f"  raw celery: {x} tasks/s | flowbeat: {y} persisted steps/s | "
        f"ratio: Y/X = {r} (target >= {TARGET_RATIO:.2f})"
    )
    disturbed = sum(r.disturbed for r in rounds)
    verdict = (
        "every one disturbed: the median is of all of them, not a clean figure"
        if disturbed == len(rounds)
        else f"{disturbed} disturbed and left out of the median"
    )
    print(f"  {len(rounds)} rounds (raw/flowbeat=ratio; calibration before/after), {verdict}:")
    for each in rounds:
        print(_round_line(each))
    before, after = calibration["before"], calibration["after"]
    print(
        f"  calibration: {CALIBRATION_LOOP:,}-step loop {before['loop_ms']:.0f} ms before, "
        f"{after['loop_ms']:.0f} ms after the run; background "
        f"{before['background_cores']:.2f}/{after['background_cores']:.2f} cores; "
        f"load {before['load_1m']:.2f} before, {after['load_1m']:.2f} after"
    )
    cpu_ratio = _median_cpu_ratio(rounds)
    median = f"; median CPU ratio {cpu_ratio:.2f}" if cpu_ratio is not None else ""
    print(f"  CPU per chain/job of the median round (ms){median}:")
    if raw:
        print(_cpu_line("raw celery", raw.cpu_ms_per_chain))
    if fb:
        print(_cpu_line("flowbeat", fb.cpu_ms_per_job))
    if fb:
        print(
            f"  enqueue latency p50={fb.enqueue_p50_ms:.1f}ms p99={fb.enqueue_p99_ms:.1f}ms, "
            f"rate={fb.enqueue_rate_jobs_per_s:.0f} jobs/s ({args.clients} clients)"
        )


def on_sigterm(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds the ExitStacks: processes, database, Redis DBs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.chain_throughput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--jobs", type=int, default=1000, help="chains / jobs per side")
    parser.add_argument("--warmup", type=int, default=20, help="untimed chains/jobs per side")
    parser.add_argument("--clients", type=int, default=4, help="concurrent HTTP client threads")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per side")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--only", choices=["raw", "flowbeat"], help="run one side only")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="A/B rounds, the order alternating; the round with the median ratio is reported",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes per side, each of concurrency BENCH_CONCURRENCY (2)",
    )
    parser.add_argument(
        "--without-event-log",
        action="store_true",
        help="disable the event log's triggers on flowbeat's side: what any cheaper event log "
        "could at most save (for measuring; streams and run history need the log)",
    )
    parser.add_argument(
        "--py-spy",
        type=Path,
        metavar="DIR",
        help="record py-spy profiles of both sides' first worker and flowbeat's API into DIR "
        "(slows them down: the figures of such a run are not comparable)",
    )
    args = parser.parse_args(argv)

    signal.signal(signal.SIGTERM, on_sigterm)
    calibration = {"before": calibrate()}
    rounds: list[Round] = []
    with ExitStack() as stack:
        ws = workspace(stack, "chain")

        def side_a() -> RawResult:
            redis_url = ws.fresh_redis(0)
            result = run_raw(
                args.jobs, args.warmup, redis_url, ws.tmp, args.timeout, args.workers, args.py_spy
            )
            log(f"A: {result.tasks_per_s:.0f} tasks/s")
            return result

        def side_b() -> FlowbeatResult:
            result = run_flowbeat(
                args.jobs,
                args.warmup,
                args.clients,
                ws.fresh_redis(1),
                ws.admin_db,
                ws.tmp,
                args.timeout,
                args.py_spy,
                args.workers,
                args.without_event_log,
            )
            log(f"B: {result.steps_per_s:.0f} persisted steps/s")
            return result

        for number in range(args.rounds):
            log(f"round {number + 1} of {args.rounds}")
            rounds.append(run_round(number, args.only, side_a, side_b))

    calibration["after"] = calibrate()
    return report(args, rounds, calibration)


if __name__ == "__main__":
    sys.exit(main())
