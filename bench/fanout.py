"""A 10,000-item fan-out through flowbeat against a raw Celery chord of the same size.

    python -m bench.fanout --items 10000 [--lanes 4] [--rounds 1] [--json]

One machine, one Redis server, the same worker settings on both sides (prefork,
``--concurrency 2`` or ``BENCH_CONCURRENCY``, the prefetch multiplier of
``Settings.worker_prefetch``), one worker at a time:

A. raw Celery (``bench.raw_app``): ``chord([noop.si()] * N, noop.si())``, the client waits on
   the body's result. items/s = N / (submit .. body's result).
B. flowbeat: one job of a profile whose only step has ``for_each`` over N items, POSTed to the
   API with the items as a param. The step stores N shard rows and replaces itself with a
   chord of ``--lanes`` lanes that take one shard per message; the chord body gathers the N
   outputs, in item order, into the step's checkpoint and the job's result.
   items/s = N / (POST .. job final), every shard claimed and checkpointed in PostgreSQL.

Both sides first run a small fan-out (not timed) so the pools and imports are hot.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg

from bench.chain_throughput import raw_worker
from bench.harness import WORKER_CONCURRENCY, log, on_sigterm, tail, workspace
from bench.rounds import alternate
from bench.stack import start_flowbeat

PIPELINE = "bench_fanout"
WARMUP_ITEMS = 50
POLL_S = 0.05


def profile_yaml(lanes: int) -> str:
    return f"""\
name: {PIPELINE}
description: one for_each step over the items param, for bench.fanout
params:
  items: {{type: array}}
steps:
  - id: each
    action: noop
    for_each: {{items: "${{{{ params.items }}}}", max_parallel: {lanes}}}
    with: {{item: "${{{{ item }}}}"}}
"""


@dataclass
class Side:
    items: int
    wall_s: float
    items_per_s: float


def run_raw(items: int, redis_url: str, tmp: Path, timeout_s: float) -> Side:
    from celery import chord

    with raw_worker(redis_url, tmp) as (raw_app, _):
        noop = raw_app.noop

        def fan_out(count: int) -> float:
            started = time.perf_counter()
            result = chord([noop.si() for _ in range(count)], noop.si()).apply_async()
            result.get(timeout=timeout_s, propagate=True)
            return time.perf_counter() - started

        fan_out(WARMUP_ITEMS)
        log(f"A: a chord of {items} no-op tasks")
        wall = fan_out(items)
    return Side(items, wall, items / wall)


def _job_final(conn: psycopg.Connection[Any], job_id: str) -> str | None:
    row = conn.execute(
        "SELECT status FROM jobs WHERE id = %s AND status IN ('succeeded', 'failed', 'cancelled')",
        (job_id,),
    ).fetchone()
    return None if row is None else str(row[0])


def _fan_out(
    client: httpx.Client,
    conn: psycopg.Connection[Any],
    count: int,
    deadline: float,
    dead: Callable[[], bool],
) -> float:
    started = time.perf_counter()
    response = client.post(
        "/v1/jobs", json={"pipeline": PIPELINE, "params": {"items": list(range(count))}}
    )
    if response.status_code != 202:
        raise RuntimeError(f"POST /v1/jobs: {response.status_code} {response.text[:300]}")
    job_id = response.json()["job"]["id"]
    while (status := _job_final(conn, job_id)) is None:
        if time.monotonic() > deadline or dead():
            raise TimeoutError(f"job {job_id} not final")
        time.sleep(POLL_S)
    if status != "succeeded":
        raise RuntimeError(f"job {job_id} {status}")
    return time.perf_counter() - started


def run_flowbeat(
    items: int, lanes: int, redis_url: str, admin_db: str, tmp: Path, timeout_s: float
) -> Side:
    with ExitStack() as stack:
        fb = start_flowbeat(stack, {PIPELINE: profile_yaml(lanes)}, redis_url, admin_db, tmp)
        headers = {"Authorization": f"Bearer {fb.key}"}
        client = stack.enter_context(httpx.Client(base_url=fb.base_url, headers=headers))
        try:
            _fan_out(client, fb.conn, WARMUP_ITEMS, time.monotonic() + timeout_s, fb.dead)
            log(f"B: a job fanning out over {items} items with {lanes} lanes")
            wall = _fan_out(client, fb.conn, items, time.monotonic() + timeout_s, fb.dead)
        except (RuntimeError, TimeoutError):
            log(f"worker log:\n{tail(fb.worker_log)}")
            raise
    return Side(items, wall, items / wall)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.fanout",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--items", type=int, default=10_000, help="items in the fan-out")
    parser.add_argument(
        "--lanes", type=int, default=2 * WORKER_CONCURRENCY, help="flowbeat's max_parallel"
    )
    parser.add_argument("--rounds", type=int, default=1, help="A/B rounds, alternating order")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per side")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)

    signal.signal(signal.SIGTERM, on_sigterm)
    with ExitStack() as stack:
        ws = workspace(stack, "fanout")

        def side_a() -> Side:
            side = run_raw(args.items, ws.fresh_redis(0), ws.tmp, args.timeout)
            log(f"A: {side.items_per_s:.0f} items/s")
            return side

        def side_b() -> Side:
            url = ws.fresh_redis(1)
            side = run_flowbeat(args.items, args.lanes, url, ws.admin_db, ws.tmp, args.timeout)
            log(f"B: {side.items_per_s:.0f} items/s")
            return side

        rounds = [alternate(number, side_a, side_b) for number in range(args.rounds)]
    return report(args, rounds)


def report(args: argparse.Namespace, rounds: list[tuple[Side, Side]]) -> int:
    ratios = [b.items_per_s / a.items_per_s for a, b in rounds]
    median = sorted(range(len(rounds)), key=lambda i: ratios[i])[(len(rounds) - 1) // 2]
    raw, fb = rounds[median]
    if args.json:
        figures = {
            "items": args.items,
            "lanes": args.lanes,
            "worker": {"pool": "prefork", "concurrency": WORKER_CONCURRENCY},
            "raw_celery": asdict(raw),
            "flowbeat": asdict(fb),
            "ratio": ratios[median],
            "round_ratios": ratios,
        }
        print(json.dumps(figures, indent=2))
        return 0
    print()
    print(
        f"fan-out of {args.items} no-op items, flowbeat lanes {args.lanes}, "
        f"prefork concurrency {WORKER_CONCURRENCY}, {os.cpu_count()} cpus"
    )
    print(
        f"  raw celery chord: {raw.items_per_s:.0f} items/s ({raw.wall_s:.1f} s) | "
        f"flowbeat for_each: {fb.items_per_s:.0f} items/s ({fb.wall_s:.1f} s) | "
        f"ratio {ratios[median]:.2f}"
    )
    if len(rounds) > 1:
        print("  rounds: " + ", ".join(f"{r:.2f}" for r in ratios) + "; the median is shown")
    return 0


if __name__ == "__main__":
    sys.exit(main())
