"""The flowbeat side of a bench: a fresh database with a key, the API and a worker as
subprocesses, jobs posted by client threads and waited for until final."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import psycopg
from psycopg import sql

from bench.checkout import Checkout, confirm
from bench.cpu import CpuMeter
from bench.harness import (
    FINAL,
    PIPELINE,
    PROFILE_YAML,
    REPO,
    STEPS_PER_JOB,
    _libpq,
    free_port,
    fresh_database,
    log,
    pct,
    py_spy,
    subprocess_group,
    tail,
    wait_for_worker,
    worker_argv,
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
    base_url: str,
    key: str,
    count: int,
    threads: int,
    latencies: list[float],
    errors: list[str],
    pipeline: str = PIPELINE,
) -> None:
    """``count`` POSTs spread over ``threads`` clients, each with its own keep-alive connection.

    The load generator shares the cores with what it measures, so it is the standard library's
    ``http.client``: a quarter of the CPU per request of a full-featured client such as httpx.
    """
    counter = iter(range(count))
    lock = threading.Lock()
    body = json.dumps({"pipeline": pipeline, "params": {}}).encode()
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


def _key_in_checkout(checkout: Checkout, env: dict[str, str], without_event_log: bool) -> str:
    """The base side's database (``FLOWBEAT_DATABASE_URL`` of ``env``, made empty) migrated by
    the checkout's own migrations, and an admin key made by its own CLI."""
    log("base: migrating with the checkout's migrations")
    checkout.run([sys.executable, "-m", "service.cli", "migrate"], env)
    with psycopg.connect(_libpq(env["FLOWBEAT_DATABASE_URL"])) as conn:
        heads = [row[0] for row in conn.execute("SELECT version_num FROM alembic_version")]
    log(f"base: schema at {', '.join(heads)}")
    if without_event_log:
        disable_event_log(env["FLOWBEAT_DATABASE_URL"])
    argv = [sys.executable, "-m", "service.cli", "keys", "create", "--scopes", "admin"]
    return checkout.run([*argv, "--owner", "bench"], env).strip().splitlines()[-1]


def _start_api(
    stack: ExitStack, env: dict[str, str], tmp: Path, checkout: Checkout | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """The API as deployments start it (``flowbeat api``: uvicorn, an access log line for each
    request), as a subprocess; returns once /health answers 200."""
    argv = [sys.executable, "-m", "service.cli", "api"]
    return serve_http(stack, argv, env, tmp / "api.log", checkout)


def serve_http(
    stack: ExitStack,
    argv: list[str],
    env: dict[str, str],
    log_path: Path,
    checkout: Checkout | None = None,
) -> tuple[subprocess.Popen[bytes], str]:
    """``argv`` with ``--host 127.0.0.1 --port <a free one>``, as a subprocess stopped when
    ``stack`` closes (on ``checkout``'s code if given); returns it and its base URL once its
    /health answers 200."""
    port = free_port()
    argv = [*argv, "--host", "127.0.0.1", "--port", str(port)]
    proc = stack.enter_context(_started(argv, env, log_path, " ".join(argv[2:4]), checkout))
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{argv[2:4]} exited ({proc.returncode}):\n{tail(log_path)}")
        try:
            if httpx.get(f"{base_url}/health", timeout=2).status_code == 200:
                return proc, base_url
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{argv[2:4]} not healthy in 60s:\n{tail(log_path)}")
        time.sleep(0.2)


def _started(
    argv: list[str], env: dict[str, str], log_path: Path, name: str, checkout: Checkout | None
) -> AbstractContextManager[subprocess.Popen[bytes]]:
    """``subprocess_group`` of ``argv``, or of ``argv`` run on ``checkout``'s code from it."""
    if checkout is None:
        return subprocess_group(argv, env, log_path, name)
    argv, env = checkout.launch(argv), checkout.env(env)
    return subprocess_group(argv, env, log_path, f"base {name}", checkout.root)


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
    checkout: Checkout | None = None,
) -> FlowbeatStack:
    """Everything is stopped and dropped when ``stack`` closes. ``profiles`` maps a name to
    the YAML of a profile the API serves as shipped; each is validated here first.
    ``settings`` are extra ``FLOWBEAT_*`` variables for every process. The per-key request
    limit and the open-jobs cap are off: a bench sends as fast as the API answers. The
    first of ``workers`` worker processes logs to ``worker_log``, the others beside it.
    With ``checkout``, the database is migrated and the API and workers run on its code."""
    from service.language.loading import load_profile_file

    profiles_dir = tmp / "profiles"
    profiles_dir.mkdir(exist_ok=True)
    for name, text in profiles.items():
        (profiles_dir / f"{name}.yaml").write_text(text)
        load_profile_file(profiles_dir / f"{name}.yaml")
    if checkout is None:
        db_url, key = _database_with_key(stack, admin_db, without_event_log)
    else:
        db_url = stack.enter_context(fresh_database(admin_db))
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
    if checkout is not None:
        env = checkout.env(env)
        key = _key_in_checkout(checkout, env, without_event_log)
    api_proc, base_url = _start_api(stack, env, tmp, checkout)
    procs = _start_workers(stack, env, tmp, workers, checkout)
    if checkout is not None:
        for log_path in [tmp / "api.log", *tmp.glob("flowbeat-worker*.log")]:
            confirm(log_path.read_text(errors="replace"), log_path.name)
    conn = stack.enter_context(psycopg.connect(_libpq(db_url), autocommit=True))
    worker_log = tmp / "flowbeat-worker.log"
    return FlowbeatStack(base_url, key, conn, api_proc, procs, tmp / "api.log", worker_log, env)


def _start_workers(
    stack: ExitStack, env: dict[str, str], tmp: Path, workers: int, checkout: Checkout | None
) -> list[subprocess.Popen[bytes]]:
    """``workers`` worker processes, each answering a ping before the next starts; the first
    logs to ``flowbeat-worker.log``, the others beside it."""
    from celery import Celery

    from service.platform.constants import QUEUE_CONTROL, QUEUE_STEPS

    control = Celery("bench-control", broker=env["FLOWBEAT_BROKER_URL"])
    stack.callback(control.close)
    procs = []
    for index in range(workers):
        node = f"bench-flowbeat-{os.getpid()}-{index}@{socket.gethostname()}"
        log_path = tmp / ("flowbeat-worker.log" if index == 0 else f"flowbeat-worker-{index}.log")
        argv = worker_argv("tasks.app", f"{QUEUE_STEPS},{QUEUE_CONTROL}", node)
        proc = stack.enter_context(_started(argv, env, log_path, "flowbeat worker", checkout))
        wait_for_worker(control, node, proc, log_path)
        procs.append(proc)
    return procs


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
    checkout: Checkout | None = None,
) -> FlowbeatResult:
    """The chain on flowbeat: this tree's, or ``checkout``'s (the base side, which logs as
    "base" and keeps its logs and profiles apart)."""
    side, spy = ("B", "flowbeat") if checkout is None else ("base", "base")
    if checkout is not None:
        tmp = tmp / "base"
        tmp.mkdir(exist_ok=True)
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
            checkout=checkout,
        )
        if warmup:
            errors: list[str] = []
            post_jobs(fb.base_url, fb.key, warmup, min(threads, warmup), [], errors)
            if errors:
                raise RuntimeError(f"warm-up POSTs failed: {errors[:3]}\n{tail(fb.api_log)}")
            wait_final(fb.conn, warmup, time.monotonic() + timeout_s, fb.dead)

        log(f"{side}: POSTing {n} jobs of {STEPS_PER_JOB} no-op steps, {threads} client threads")
        latencies: list[float] = []
        errors = []
        with ExitStack() as spies:
            spies.enter_context(py_spy(spy_dir, fb.worker.pid, f"{spy}-worker"))
            spies.enter_context(py_spy(spy_dir, fb.api.pid, f"{spy}-api"))
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
            log(f"{side}: {len(errors)} POSTs failed, e.g. {errors[0]}")
        if fb.dead() or any(status != "succeeded" for status in counts):
            log(f"{side}: jobs final: {counts}; worker log:\n{tail(fb.worker_log)}")
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
