"""The sides of ``bench.peers``: raw Celery and flowbeat from this venv, on the machinery of
the chain and fan-out benches; each peer as a subprocess in the peers' venv.

Every side gets the run's own Redis server (its broker's CPU is then the side's alone) and,
where it needs one, a fresh PostgreSQL database on the shared server, dropped after.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
import redis

from bench.chain_throughput import raw_worker, wait_results
from bench.cpu import CpuMeter
from bench.fanout import PIPELINE as FANOUT_PIPELINE
from bench.fanout import WARMUP_ITEMS, _fan_out, profile_yaml
from bench.harness import (
    PIPELINE,
    PROFILE_YAML,
    REPO,
    free_port,
    fresh_database,
    log,
    subprocess_group,
    tail,
)
from bench.peers.measure import (
    FanOut,
    PeakPss,
    SideResult,
    chains_result,
    fanout_result,
    parse,
    partial_fanout,
)
from bench.stack import _epoch, post_jobs, serve_http, start_flowbeat, wait_final
from service.platform.db import libpq_url

PEERS_PYTHON = REPO / ".venv-peers" / "bin" / "python"
CLIENT_THREADS = 4


@dataclass(frozen=True)
class Run:
    """What every side of one round gets."""

    chains: int
    fanout: int
    warmup: int
    concurrency: int
    redis_base: str
    redis_pid: int
    admin_db: str
    tmp: Path
    timeout_s: float
    budget_s: float
    fanout_timeout_s: float

    def redis_url_of(self, db: int) -> str:
        return f"{self.redis_base}/{db}"

    def redis_url(self, db: int) -> str:
        """DB ``db`` of the run's Redis server, emptied first."""
        url = self.redis_url_of(db)
        client = redis.Redis.from_url(url, socket_timeout=10)
        try:
            client.flushdb()
        finally:
            client.close()
        return url


@contextmanager
def private_redis(tmp: Path) -> Iterator[tuple[str, int]]:
    """A Redis server of the run's own, without persistence (as a queue's broker runs), on
    a free port: (its base URL, its pid)."""
    port = free_port()
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    argv += ["--appendonly", "no", "--dir", str(tmp)]
    with subprocess_group(argv, dict(os.environ), tmp / "redis.log", "redis-server") as proc:
        client = redis.Redis(port=port, socket_timeout=2)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"redis-server did not start:\n{tail(tmp / 'redis.log')}"
                    ) from None
                time.sleep(0.1)
        client.close()
        yield f"redis://127.0.0.1:{port}", proc.pid


def raw_celery(run: Run) -> SideResult:
    """``chain(noop.si() x 3)`` per job and ``group([noop.si()] * N)`` for the fan-out, its
    results gathered by the client, on ``bench.raw_app`` (the chain bench's baseline). A
    ``chord`` would gather on a worker, but on the Redis result backend it runs at a tenth of
    the group's rate at this size (docs/benchmarks.md, the fan-out bench)."""
    from celery import chain, group
    from celery.exceptions import TimeoutError as CeleryTimeout

    with raw_worker(run.redis_url(1), run.tmp) as (raw_app, proc):
        noop = raw_app.noop
        deadline = time.monotonic() + run.timeout_s
        wait_results(
            [chain(noop.si(), noop.si(), noop.si()).apply_async() for _ in "x" * 20], deadline
        )
        log(f"raw celery: {run.chains} chains of 3 no-op tasks")
        meter = CpuMeter({"worker": [proc.pid], "broker": [run.redis_pid]})
        with PeakPss([proc.pid]) as peak:
            meter.start()
            t0 = time.time()
            starts, results = [], []
            for _ in range(run.chains):
                starts.append(time.time())
                results.append(chain(noop.si(), noop.si(), noop.si()).apply_async())
            t1, _ = wait_results(results, deadline)
            cpu = meter.stop()
        cpu["client"] -= peak.cpu_s
        ends = [_epoch(r.date_done) for r in results]
        latencies = [end - start for start, end in zip(starts, ends, strict=True)]
        result = SideResult("raw celery")
        result.chains = chains_result(run.chains, t1 - t0, latencies, cpu, peak.mib)

        def fan_out(items: int) -> FanOut:
            """Items done at a timeout: the results stored since the start, one key each
            (counting them by ``completed_count`` would take a round trip an item)."""
            results = redis.Redis.from_url(run.redis_url_of(1), socket_timeout=10)
            stored = results.dbsize()
            started = time.perf_counter()
            fan = group(noop.si() for _ in range(items)).apply_async()
            try:
                fan.get(timeout=run.fanout_timeout_s, propagate=True)
            except CeleryTimeout:
                done = results.dbsize() - stored
                return partial_fanout(items, done, started, run.fanout_timeout_s)
            finally:
                results.close()
            return fanout_result(items, time.perf_counter() - started)

        fan_out(WARMUP_ITEMS)
        log(f"raw celery: a group of {run.fanout} no-op tasks, its results gathered")
        result.fanout = fan_out(run.fanout)
    return result


@dataclass(frozen=True)
class Posted:
    """Jobs to POST: where, with which key, how many, and the list their failures go to."""

    base_url: str
    key: str
    count: int
    errors: list[str]


@dataclass(frozen=True)
class Timed:
    started: float
    """Epoch seconds of the first POST."""
    wall_s: float
    cpu_s: dict[str, float]
    """By part, the database's as ``db``, the client's without the PSS sampler's."""
    peak_mib: float


def _posted(
    posted: Posted,
    roots: dict[str, list[int]],
    conn: psycopg.Connection[Any],
    done: Callable[[], object],
) -> Timed:
    """The side's jobs POSTed by the client threads and waited for by ``done``, timed, their
    CPU metered by part and the peak PSS of every part's processes but the broker's taken;
    raises if any POST failed, the warm-up's included."""
    meter = CpuMeter(roots, conn)
    own = [pid for part, pids in roots.items() if part != "broker" for pid in pids]
    with PeakPss(own) as peak:
        meter.start()
        started = time.time()
        post_jobs(posted.base_url, posted.key, posted.count, CLIENT_THREADS, [], posted.errors)
        done()
        wall_s = time.time() - started
        cpu = meter.stop()
    cpu["client"] -= peak.cpu_s
    cpu["db"] = cpu.pop("postgres")
    if posted.errors:
        raise RuntimeError(f"{len(posted.errors)} POSTs failed, e.g. {posted.errors[0]}")
    return Timed(started, wall_s, cpu, peak.mib)


FLOOR_DRAIN_POLL_S = 0.05


def floor(run: Run) -> SideResult:
    """The least a persisted chain job costs in flowbeat's shape: POSTed by the same clients
    to ``bench.raw_api``, which stores it with one ``INSERT`` and sends one Celery message, run
    by ``bench.floor_app``'s worker as a claim and three checkpoints, one statement each, on
    tables with a primary key and nothing else. Its rate over a peer's is the most any design
    that takes jobs over HTTP, runs them from Celery and commits every step's checkpoint could
    reach against that peer on this machine. Done when the queue and Kombu's unacked hash are
    both empty, and every job is settled."""
    from bench.floor_app import FLOOR_CHAIN, TABLES

    with ExitStack() as stack:
        store = libpq_url(stack.enter_context(fresh_database(run.admin_db)))
        conn = stack.enter_context(psycopg.connect(store, autocommit=True))
        conn.execute(TABLES)
        url = run.redis_url(1)
        env = {"BENCH_RAW_STORE_URL": store, "BENCH_RAW_TASK": FLOOR_CHAIN}
        floor_app, worker = stack.enter_context(
            raw_worker(url, run.tmp, module="bench.floor_app", env=env)
        )
        env = {**os.environ, **env, "BENCH_RAW_REDIS_URL": url, "PYTHONPATH": str(REPO)}
        argv = [sys.executable, "-m", "bench.raw_api"]
        api, base_url = serve_http(stack, argv, env, run.tmp / "floor-api.log")
        broker = redis.Redis.from_url(url, socket_timeout=10)
        stack.callback(broker.close)
        queue = floor_app.app.conf.task_default_queue
        errors: list[str] = []
        post_jobs(base_url, "unused", run.warmup, CLIENT_THREADS, [], errors)
        _drained(broker, conn, queue, time.monotonic() + run.timeout_s)
        log(f"floor: {run.chains} jobs stored, each run as a claim and three checkpoints")
        timed = _posted(
            Posted(base_url, "unused", run.chains, errors),
            {"api": [api.pid], "worker": [worker.pid], "broker": [run.redis_pid]},
            conn,
            lambda: _drained(broker, conn, queue, time.monotonic() + run.timeout_s),
        )
        rows = conn.execute(FLOOR_LATENCIES).fetchall()
        result = SideResult("floor")
        latencies = [float(row[0]) for row in rows if row[0] is not None]
        result.chains = chains_result(
            run.chains, timed.wall_s, latencies[run.warmup :], timed.cpu_s, timed.peak_mib
        )
    return result


FLOOR_LATENCIES = """
    SELECT extract(epoch FROM max(s.at) - j.created_at)
      FROM raw_jobs AS j JOIN raw_steps AS s ON s.job_id = j.id
     GROUP BY j.id, j.created_at ORDER BY j.created_at"""


def _drained(
    broker: redis.Redis, conn: psycopg.Connection[Any], queue: str, deadline: float
) -> None:
    """Every message sent was run and acknowledged (``task_acks_late`` keeps a message in
    ``unacked`` until its task returns), and every job it stored has settled."""
    while (
        broker.llen(queue)
        or broker.hlen("unacked")
        or _one(conn, "SELECT count(*) FROM raw_jobs WHERE status IS DISTINCT FROM 'succeeded'")
    ):
        if time.monotonic() > deadline:
            raise TimeoutError("the floor's worker did not settle its jobs in time")
        time.sleep(FLOOR_DRAIN_POLL_S)


def _one(conn: psycopg.Connection[Any], query: str) -> int:
    row = conn.execute(query).fetchone()
    return int(row[0]) if row else 0


LATENCIES = (
    "SELECT extract(epoch FROM finished_at - created_at) FROM jobs "
    "WHERE pipeline = %s AND created_at >= %s"
)


SHARDS_DONE = (
    "SELECT count(*) FROM step_runs JOIN jobs ON jobs.id = step_runs.job_id "
    "WHERE jobs.pipeline = %s AND step_runs.shard >= 0 AND step_runs.status = 'succeeded'"
)


def flowbeat(run: Run, lanes: int) -> SideResult:
    """Jobs of the chain bench's 3-step profile POSTed by client threads; one job of the fan-out
    bench's ``for_each`` profile. Every step claimed and checkpointed in PostgreSQL."""
    profiles = {PIPELINE: PROFILE_YAML, FANOUT_PIPELINE: profile_yaml(lanes)}
    with ExitStack() as stack:
        fb = start_flowbeat(stack, profiles, run.redis_url(2), run.admin_db, run.tmp)
        errors: list[str] = []
        post_jobs(fb.base_url, fb.key, run.warmup, CLIENT_THREADS, [], errors)
        wait_final(fb.conn, run.warmup, time.monotonic() + run.timeout_s, fb.dead)
        log(f"flowbeat: {run.chains} jobs of 3 no-op steps")
        workers = [w.pid for w in fb.workers]
        deadline = time.monotonic() + run.timeout_s
        timed = _posted(
            Posted(fb.base_url, fb.key, run.chains, errors),
            {"api": [fb.api.pid], "worker": workers, "broker": [run.redis_pid]},
            fb.conn,
            lambda: wait_final(fb.conn, run.warmup + run.chains, deadline, fb.dead),
        )
        since = datetime.fromtimestamp(timed.started, UTC)
        rows = fb.conn.execute(LATENCIES, (PIPELINE, since)).fetchall()
        result = SideResult("flowbeat")
        latencies = [float(row[0]) for row in rows]
        result.chains = chains_result(
            run.chains, timed.wall_s, latencies, timed.cpu_s, timed.peak_mib
        )
        headers = {"Authorization": f"Bearer {fb.key}"}
        client = stack.enter_context(httpx.Client(base_url=fb.base_url, headers=headers))
        _fan_out(client, fb.conn, WARMUP_ITEMS, time.monotonic() + run.timeout_s, fb.dead)
        deadline = time.monotonic() + run.fanout_timeout_s
        log(f"flowbeat: a job fanning out over {run.fanout} items with {lanes} lanes")
        started = time.perf_counter()
        try:
            wall = _fan_out(client, fb.conn, run.fanout, deadline, fb.dead)
            result.fanout = fanout_result(run.fanout, wall)
        except TimeoutError:
            shards = fb.conn.execute(SHARDS_DONE, (FANOUT_PIPELINE,)).fetchone()
            done = int(shards[0]) if shards else 0
            result.fanout = partial_fanout(run.fanout, done, started, run.fanout_timeout_s)
    return result


def peer(module: str, run: Run, redis_db: int | None) -> SideResult:
    """``bench.peers.<module>`` in the peers' venv; its figures from its result line. A peer
    that fails or overruns is reported with a note, not raised: the others still count."""
    argv = [str(PEERS_PYTHON), "-m", f"bench.peers.{module}"]
    argv += ["--chains", str(run.chains), "--fanout", str(run.fanout)]
    argv += ["--warmup", str(run.warmup), "--concurrency", str(run.concurrency)]
    argv += ["--admin-db", run.admin_db, "--tmp", str(run.tmp)]
    argv += ["--timeout", str(run.timeout_s), "--budget", str(run.budget_s)]
    argv += ["--fanout-timeout", str(run.fanout_timeout_s)]
    if redis_db is not None:
        argv += ["--redis-url", run.redis_url(redis_db), "--redis-pid", str(run.redis_pid)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    limit = 2 * run.timeout_s + run.fanout_timeout_s + 300
    name = module.removesuffix("_side")
    log_path = run.tmp / f"{module}.out"
    with subprocess_group(argv, env, log_path, name) as proc:
        try:
            code = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            return SideResult(name, note=f"stopped after {limit:.0f} s")
    if code:
        log(f"{name} exited {code}:\n{tail(log_path)}")
        return SideResult(name, note=f"exited {code}")
    return parse(log_path.read_text(errors="replace"))


def peers_ready() -> None:
    if not PEERS_PYTHON.exists():
        sys.exit(f"{PEERS_PYTHON} is missing: `make bench-peers` builds the peers' venv")
