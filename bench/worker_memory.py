"""Worker memory over 100,000 steps: flowbeat's worker against raw Celery's on the same chain.

    python -m bench.worker_memory --steps 100000 [--batch 600] [--json]

One machine, one Redis server, the same worker settings on both sides (prefork,
``--concurrency 2`` or ``BENCH_CONCURRENCY``, the prefetch multiplier of
``Settings.worker_prefetch``), one worker at a time:

A. raw Celery (``bench.raw_app``): chains ``noop.si() | noop.si() | noop.si()``, the client
   waiting on each chain's last result.
B. flowbeat: jobs of the same 3-step no-op chain POSTed to the API, every step claimed and
   checkpointed in PostgreSQL, the database polled until every job is final.

Each side runs its steps in batches, so the queue never holds more than one batch and what is
measured is the worker working, not a backlog. After the warm-up and after every batch, the
proportional set size (PSS, ``/proc/<pid>/smaps_rollup``) of the worker's main process and of
its pool processes is read. PSS splits the pages the forked processes share among them, so
the sum is what the worker really holds. Reported per side: that sum after the warm-up, its
peak, at the end, and the growth from warm-up to end per 100,000 steps.
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
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.chain_throughput import raw_worker, wait_results
from bench.cpu import pss_kib
from bench.harness import (
    PIPELINE,
    PROFILE_YAML,
    STEPS_PER_JOB,
    WORKER_CONCURRENCY,
    log,
    on_sigterm,
    tail,
    workspace,
)
from bench.rounds import alternate
from bench.stack import post_jobs, start_flowbeat, wait_final

WARMUP_CHAINS = 200
CLIENT_THREADS = 4
KIB_PER_MIB = 1024


@dataclass
class Sample:
    steps: int
    main_kib: int
    pool_kib: int

    @property
    def total_mib(self) -> float:
        return (self.main_kib + self.pool_kib) / KIB_PER_MIB


@dataclass
class Side:
    name: str
    samples: list[Sample] = field(default_factory=list)

    @property
    def warm_mib(self) -> float:
        return self.samples[0].total_mib

    @property
    def peak_mib(self) -> float:
        return max(sample.total_mib for sample in self.samples)

    @property
    def end_mib(self) -> float:
        return self.samples[-1].total_mib

    @property
    def growth_mib_per_100k(self) -> float:
        steps = self.samples[-1].steps - self.samples[0].steps
        return (self.end_mib - self.warm_mib) * 100_000 / steps if steps else 0.0


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry))
    return found


def sample(worker_pid: int, steps: int) -> Sample:
    pool = sum(pss_kib(child) for child in children(worker_pid))
    return Sample(steps, pss_kib(worker_pid), pool)


def run_batches(
    name: str, worker_pid: int, chains: int, batch: int, run: Callable[[int], None]
) -> Side:
    """``run(n)`` runs ``n`` chains to the end; the worker is sampled after the warm-up and
    after every batch."""
    side = Side(name)
    run(WARMUP_CHAINS)
    side.samples.append(sample(worker_pid, 0))
    done = 0
    while done < chains:
        count = min(batch, chains - done)
        run(count)
        done += count
        side.samples.append(sample(worker_pid, done * STEPS_PER_JOB))
        log(f"{name}: {done * STEPS_PER_JOB} steps, worker {side.samples[-1].total_mib:.1f} MiB")
    return side


def run_raw(chains: int, batch: int, redis_url: str, tmp: Path, timeout_s: float) -> Side:
    from celery import chain

    with raw_worker(redis_url, tmp) as (raw_app, proc):
        noop = raw_app.noop

        def run(count: int) -> None:
            results = [chain(noop.si(), noop.si(), noop.si()).apply_async() for _ in range(count)]
            wait_results(results, time.monotonic() + timeout_s)

        return run_batches("A", proc.pid, chains, batch, run)


def run_flowbeat(
    chains: int, batch: int, redis_url: str, admin_db: str, tmp: Path, timeout_s: float
) -> Side:
    with ExitStack() as stack:
        fb = start_flowbeat(stack, {PIPELINE: PROFILE_YAML}, redis_url, admin_db, tmp)
        posted = 0

        def run(count: int) -> None:
            nonlocal posted
            errors: list[str] = []
            post_jobs(fb.base_url, fb.key, count, CLIENT_THREADS, [], errors)
            if errors:
                raise RuntimeError(f"POSTs failed: {errors[:3]}\n{tail(fb.api_log)}")
            posted += count
            counts = wait_final(fb.conn, posted, time.monotonic() + timeout_s, fb.dead)
            if set(counts) != {"succeeded"}:
                raise RuntimeError(f"jobs not succeeded: {counts}\n{tail(fb.worker_log)}")

        return run_batches("B", fb.worker.pid, chains, batch, run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.worker_memory",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--steps", type=int, default=100_000, help="steps per side")
    parser.add_argument("--batch", type=int, default=600, help="chains per batch")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per batch")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    chains = args.steps // STEPS_PER_JOB

    signal.signal(signal.SIGTERM, on_sigterm)
    with ExitStack() as stack:
        ws = workspace(stack, "memory")

        def side_a() -> Side:
            return run_raw(chains, args.batch, ws.fresh_redis(0), ws.tmp, args.timeout)

        def side_b() -> Side:
            url = ws.fresh_redis(1)
            return run_flowbeat(chains, args.batch, url, ws.admin_db, ws.tmp, args.timeout)

        raw, fb = alternate(0, side_a, side_b)
    return report(args, raw, fb)


def report(args: argparse.Namespace, raw: Side, fb: Side) -> int:
    if args.json:
        figures = {
            "steps": args.steps,
            "worker": {"pool": "prefork", "concurrency": WORKER_CONCURRENCY},
            "raw_celery": asdict(raw),
            "flowbeat": asdict(fb),
        }
        print(json.dumps(figures, indent=2))
        return 0
    print()
    print(
        f"worker memory (PSS of the main and pool processes) over {args.steps} no-op steps, "
        f"prefork concurrency {WORKER_CONCURRENCY}, {os.cpu_count()} cpus"
    )
    for side, label in ((raw, "raw celery"), (fb, "flowbeat  ")):
        print(
            f"  {label}: {side.warm_mib:.1f} MiB warm, {side.peak_mib:.1f} MiB peak, "
            f"{side.end_mib:.1f} MiB at the end; "
            f"growth {side.growth_mib_per_100k:+.1f} MiB per 100,000 steps"
        )
    print(f"  flowbeat / raw at the end: {fb.end_mib / raw.end_mib:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
