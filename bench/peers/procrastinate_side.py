"""Procrastinate on PostgreSQL: the 3-step chain as tasks that defer the next step, the
fan-out as a batch of deferred items whose last one defers the gather.

    .venv-peers/bin/python -m bench.peers.procrastinate_side --chains N --fanout M --admin-db URL

Run by ``bench.peers`` in the peers' venv, on a fresh database it creates and drops; prints
its figures as one JSON line. The workers are ``procrastinate worker`` processes, as many as
the run's concurrency, each of ``--concurrency 1`` and listening for new jobs (LISTEN/NOTIFY),
so as many jobs run at once as on every other side, on both cores.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from contextlib import ExitStack
from typing import Any

import psycopg

from bench.cpu import CpuMeter
from bench.harness import REPO, _libpq, fresh_database, log, on_sigterm, subprocess_group
from bench.peers.measure import (
    PeakPss,
    SideResult,
    chains_result,
    emit,
    fanout_result,
    partial_fanout,
    peer_parser,
    wait_until,
)

APP = "bench.peers.procrastinate_app.app"
LATENCIES = """
SELECT extract(epoch FROM done.at - deferred.at)
FROM procrastinate_jobs a
JOIN procrastinate_events deferred ON deferred.job_id = a.id AND deferred.type = 'deferred'
JOIN procrastinate_jobs c ON c.task_name = 'bench.c' AND c.args->'chain' = a.args->'chain'
JOIN procrastinate_events done ON done.job_id = c.id AND done.type = 'succeeded'
WHERE a.task_name = 'bench.a' AND (a.args->>'chain')::int >= %s
"""
ITEMS_DONE = (
    "SELECT count(*) FROM procrastinate_jobs WHERE task_name = 'bench.item' "
    "AND status = 'succeeded' AND args->>'fanout' = '1'"
)


def _count_done(conn: psycopg.Connection[Any], first: int) -> int:
    row = conn.execute(
        "SELECT count(*) FROM procrastinate_jobs WHERE task_name = 'bench.c' "
        "AND status = 'succeeded' AND (args->>'chain')::int >= %s",
        (first,),
    ).fetchone()
    return int(row[0]) if row else 0


def _start(stack: ExitStack, args: argparse.Namespace) -> tuple[psycopg.Connection[Any], list[int]]:
    """A fresh database with Procrastinate's schema and the bench's table, and the workers."""
    db_url = _libpq(stack.enter_context(fresh_database(args.admin_db)))
    os.environ["BENCH_PEERS_DATABASE_URL"] = db_url
    from bench.peers import procrastinate_app as pa

    conn = stack.enter_context(psycopg.connect(db_url, autocommit=True))
    conn.execute(pa.FANOUT_TABLE)
    with pa.app.open():
        pa.app.schema_manager.apply_schema()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    workers = []
    for index in range(args.concurrency):
        argv = [sys.executable, "-m", "procrastinate", "--app", APP, "worker"]
        argv += ["--concurrency", "1", "--name", f"bench-{index}"]
        log_path = args.tmp / f"procrastinate-{index}.log"
        proc = stack.enter_context(subprocess_group(argv, env, log_path, "procrastinate worker"))
        workers.append(proc.pid)
    return conn, workers


def _defer_chains(first: int, count: int) -> None:
    from bench.peers import procrastinate_app as pa

    async def defer() -> None:
        async with pa.app.open_async():
            await pa.step_a.batch_defer_async(*[{"chain": n} for n in range(first, first + count)])

    asyncio.run(defer())


def _fan_out(conn: psycopg.Connection[Any], fanout: int, items: int, timeout_s: float) -> float:
    """Seconds from deferring ``items`` items in one batch to the gather's end."""
    from bench.peers import procrastinate_app as pa

    started = time.perf_counter()
    deadline = time.monotonic() + timeout_s
    conn.execute("INSERT INTO bench_fanout VALUES (%s, %s)", (fanout, items))

    async def defer() -> None:
        async with pa.app.open_async():
            await pa.item.batch_defer_async(*[{"fanout": fanout}] * items)

    asyncio.run(defer())
    done = "SELECT done_at IS NOT NULL FROM bench_fanout WHERE id = %s"
    wait_until(lambda: bool(_one(conn, done, fanout)), deadline, "gather")
    return time.perf_counter() - started


def _one(conn: psycopg.Connection[Any], query: str, *params: object) -> Any:
    row = conn.execute(query, params).fetchone()
    return row[0] if row else None


def main(argv: list[str] | None = None) -> int:
    args = peer_parser("bench.peers.procrastinate_side", __doc__).parse_args(argv)
    signal.signal(signal.SIGTERM, on_sigterm)
    with ExitStack() as stack:
        conn, workers = _start(stack, args)
        deadline = time.monotonic() + args.timeout
        _defer_chains(0, args.warmup)
        wait_until(lambda: _count_done(conn, 0) >= args.warmup, deadline, "warm-up")
        _fan_out(conn, 0, 50, args.fanout_timeout)
        log(f"procrastinate: {args.chains} chains of 3 tasks, each deferring the next")
        meter = CpuMeter({"worker": workers}, conn)
        first = args.warmup
        with PeakPss(workers) as peak:
            meter.start()
            t0 = time.perf_counter()
            _defer_chains(first, args.chains)
            wait_until(lambda: _count_done(conn, first) >= args.chains, deadline, "chains")
            wall = time.perf_counter() - t0
            cpu = meter.stop()
        cpu["db"] = cpu.pop("postgres")
        cpu["client"] -= peak.cpu_s
        latencies = [float(row[0]) for row in conn.execute(LATENCIES, (first,)).fetchall()]
        result = SideResult("procrastinate")
        result.chains = chains_result(args.chains, wall, latencies, cpu, peak.mib)
        log(f"procrastinate: {args.fanout} items deferred in one batch, then a gather")
        started = time.perf_counter()
        try:
            result.fanout = fanout_result(
                args.fanout, _fan_out(conn, 1, args.fanout, args.fanout_timeout)
            )
        except TimeoutError:
            done = int(_one(conn, ITEMS_DONE) or 0)
            result.fanout = partial_fanout(args.fanout, done, started, args.fanout_timeout)
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
