"""Persisted step throughput of flowbeat against raw Celery running the same no-op chain.

    python -m bench.chain_throughput --jobs 1000 [--rounds 5] [--base REV] [--json] [--py-spy DIR]

One run, one machine, one Redis server, the same worker settings for both sides (prefork,
``--concurrency 2``, or ``BENCH_CONCURRENCY``; the prefetch multiplier of
``Settings.worker_prefetch``), one worker at a time so each side has every core:

A. raw Celery (``bench.raw_app``): N chains ``noop.si() | noop.si() | noop.si()``; the client
   waits on the AsyncResult of each chain's last task. tasks/s = 3N / (first submit .. last result).
B. flowbeat: a fresh PostgreSQL database, the API under uvicorn and a worker as subprocesses,
   N jobs of a 3-step chain profile (a -> b -> c, ``noop`` actions) POSTed to ``/v1/jobs`` by a
   few client threads; the database is polled until every job is final.
   persisted steps/s = 3N / (first POST .. last job final). Enqueue latency p50/p99 and rate too.
C. with ``--base REV``, the base: B again on the code of git revision REV, checked out in a
   temporary git worktree (``bench.checkout``), its database migrated by that revision's own
   migrations, so before and after run in the same rounds on the same machine.

The sides' order turns by one each round; each ratio (flowbeat/raw, base/raw, flowbeat/base)
has its own median over the rounds.

Each side first runs a short warm-up (not timed) so imports, connection pools and the pool
processes are hot. Everything started here (processes, the database, the Redis DBs, the temp
directory) is removed on the way out, failures and SIGTERM included.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.checkout import Checkout, worktree
from bench.cpu import CpuMeter, descendants
from bench.harness import (
    REPO,
    RESULT_POLL_S,
    STEPS_PER_JOB,
    WORKER_CONCURRENCY,
    log,
    on_sigterm,
    py_spy,
    subprocess_group,
    wait_for_worker,
    worker_argv,
    workspace,
)
from bench.rounds import (
    CALIBRATION_LOOP,
    TARGET_RATIO,
    RawResult,
    Round,
    _cpu_line,
    _round_line,
    calibrate,
    interpreter,
    machine_pace,
    mark_disturbed,
    median_round,
    pace_line,
    run_round,
)
from bench.stack import FlowbeatResult, _epoch, run_flowbeat


@contextmanager
def raw_worker(
    redis_url: str,
    tmp: Path,
    workers: int = 1,
    module: str = "bench.raw_app",
    env: dict[str, str] | None = None,
) -> Iterator[tuple[Any, subprocess.Popen[bytes]]]:
    """``bench.raw_app`` (or the app ``module``, configured as it is) bound to ``redis_url``
    and ``workers`` worker processes with ``env`` added, started and answering (the app's
    module and the first are yielded); they are stopped on exit."""
    os.environ["BENCH_RAW_REDIS_URL"] = redis_url  # read by bench.raw_app at import
    from bench import raw_app

    app_module = importlib.import_module(module)
    env = {**os.environ, **(env or {}), "BENCH_RAW_REDIS_URL": redis_url, "PYTHONPATH": str(REPO)}
    with ExitStack() as stack:
        procs = []
        for index in range(workers):
            node = f"bench-raw-{os.getpid()}-{index}@{socket.gethostname()}"
            log_path = tmp / f"raw-worker-{index}.log"
            argv = worker_argv(module, raw_app.QUEUE, node)
            proc = stack.enter_context(subprocess_group(argv, env, log_path, "raw celery worker"))
            wait_for_worker(app_module.app, node, proc, log_path)
            procs.append(proc)
        yield app_module, procs[0]


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


SIDES = ("raw", "flowbeat", "base")


def report(
    args: argparse.Namespace,
    rounds: list[Round],
    calibration: dict[str, dict[str, float]],
    base: Checkout | None = None,
) -> int:
    """Print the median round's figures (and every round's ratios); non-zero if any job failed."""
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
        "cpu_ratio_median": medians(rounds)["cpu raw/flowbeat"],
        "base": _base_figures(base, middle),
        "medians": medians(rounds),
        "rounds": [
            {
                "ratio": r.ratio,
                "cpu_ratio": r.cpu_ratio,
                "base_ratio": r.base_ratio,
                "over_base": r.over_base,
                "cpu_over_base": r.cpu_over_base,
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
        if base:
            _print_base(rounds, base, middle)
        print(pace_line(pace))
    failed = [
        side
        for r in rounds
        for side in (r.fb, r.base)
        if side and (side.http_errors or side.not_succeeded)
    ]
    for bad in failed:
        print(f"  problems: {bad.http_errors} POST errors, not succeeded: {bad.not_succeeded}")
    return 1 if failed else 0


RATIOS: dict[str, Callable[[Round], float | None]] = {
    "flowbeat/raw": lambda r: r.ratio,
    "base/raw": lambda r: r.base_ratio,
    "flowbeat/base": lambda r: r.over_base,
}
CPU_RATIOS: dict[str, Callable[[Round], float | None]] = {
    "cpu raw/flowbeat": lambda r: r.cpu_ratio,
    "cpu base/flowbeat": lambda r: r.cpu_over_base,
}


def medians(rounds: list[Round]) -> dict[str, float | None]:
    """Each ratio's own median (the lower middle one), not the median round's: the rates' over
    the undisturbed rounds (all of them when every one was disturbed), the CPU ratios' over
    every round, since CPU a job holds however busy the machine was (``Round.cpu_ratio``)."""
    clean = [r for r in rounds if not r.disturbed] or rounds

    def median(among: list[Round], ratio: Callable[[Round], float | None]) -> float | None:
        values = sorted(v for v in map(ratio, among) if v is not None)
        return values[(len(values) - 1) // 2] if values else None

    return {
        **{name: median(clean, ratio) for name, ratio in RATIOS.items()},
        **{name: median(rounds, ratio) for name, ratio in CPU_RATIOS.items()},
    }


def _base_figures(base: Checkout | None, middle: Round | None) -> dict[str, Any] | None:
    if base is None:
        return None
    result = asdict(middle.base) if middle and middle.base else None
    return {"rev": base.rev, "commit": base.commit, "median_round": result}


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
    cpu_ratio = medians(rounds)["cpu raw/flowbeat"]
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


def _print_base(rounds: list[Round], base: Checkout, middle: Round | None) -> None:
    """The base side of the median round, and each ratio's median over the rounds."""
    side = middle.base if middle else None
    rate = f"{side.steps_per_s:.0f} persisted steps/s" if side else "not run"
    print(f"  base {base.rev} ({base.commit[:12]}): {rate} in the median round")
    if side:
        print(_cpu_line("base", side.cpu_ms_per_job))
        print(
            f"  base enqueue latency p50={side.enqueue_p50_ms:.1f}ms "
            f"p99={side.enqueue_p99_ms:.1f}ms, rate={side.enqueue_rate_jobs_per_s:.0f} jobs/s"
        )
    found = {name: value for name, value in medians(rounds).items() if value is not None}
    each = ", ".join(f"{name} {value:.2f}" for name, value in found.items())
    if each:
        print(f"  medians over the rounds (rates: undisturbed rounds; CPU: all): {each}")


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
    parser.add_argument(
        "--only",
        action="append",
        choices=SIDES,
        help="run this side only; repeat it for several (--only flowbeat --only base)",
    )
    parser.add_argument(
        "--base",
        metavar="REV",
        help="a third side: flowbeat as of git revision REV (origin/main~3, a commit), checked "
        "out in a temporary git worktree and migrated by its own migrations",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="rounds, the sides' order turning each round; the round with the median "
        "flowbeat/raw ratio is reported, and each ratio's own median",
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
    wanted = set(args.only or SIDES)
    if "base" in (args.only or ()) and not args.base:
        parser.error("--only base needs --base REV")

    signal.signal(signal.SIGTERM, on_sigterm)
    calibration = {"before": calibrate()}
    rounds: list[Round] = []
    base: Checkout | None = None
    with ExitStack() as stack:
        ws = workspace(stack, "chain")
        if args.base and "base" in wanted:
            base = stack.enter_context(worktree(args.base))

        def side_a() -> RawResult:
            redis_url = ws.fresh_redis(0)
            result = run_raw(
                args.jobs, args.warmup, redis_url, ws.tmp, args.timeout, args.workers, args.py_spy
            )
            log(f"A: {result.tasks_per_s:.0f} tasks/s")
            return result

        def flowbeat_side(label: str, checkout: Checkout | None = None) -> FlowbeatResult:
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
                checkout,
            )
            log(f"{label}: {result.steps_per_s:.0f} persisted steps/s")
            return result

        def side_b() -> FlowbeatResult:
            return flowbeat_side("B")

        def side_c() -> FlowbeatResult:
            return flowbeat_side("base", base)

        for number in range(args.rounds):
            log(f"round {number + 1} of {args.rounds}")
            rounds.append(
                run_round(
                    number,
                    side_a if "raw" in wanted else None,
                    side_b if "flowbeat" in wanted else None,
                    side_c if base else None,
                )
            )

    calibration["after"] = calibrate()
    return report(args, rounds, calibration, base)


if __name__ == "__main__":
    sys.exit(main())
