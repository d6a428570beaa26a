"""Celery's prefork pool against its threads pool, for flowbeat's workers, in the same rounds.

    python -m bench.pools [--jobs 300] [--io-jobs 60] [--io-wait-ms 50] [--rounds 3] [--json]

One API, one database and one Redis DB serve every side; in each round each side gets a fresh
worker of its own pool and concurrency, in an order that turns round by round:

- ``prefork-2``: two pool processes, what ``flowbeat worker`` runs by default;
- ``threads-2``: two threads in one process;
- ``threads-8``: eight threads, what a threads pool can afford for steps that wait.

Each side runs two workloads: the chain bench's three ``noop`` steps a job (``--jobs``; the
worker's own cost a job, nothing of the action's), and three ``http.request`` steps a job to a
local endpoint that answers after ``--io-wait-ms`` (``--io-jobs``; a shipped action that waits
on I/O, through the egress policy). For each: jobs/s, and the CPU a job of the worker (its pool
processes included) and of PostgreSQL, and each side's ratio to ``prefork-2``'s in the same
round. The worker's resident memory (PSS) is read after the workloads. Rounds are calibrated
as the chain bench's are; a round on a throttled or busy machine is marked ``DISTURBED`` and
left out of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from celery import Celery

from bench.cpu import CpuMeter, descendants, pss_kib
from bench.harness import (
    PIPELINE,
    PROFILE_YAML,
    STEPS_PER_JOB,
    log,
    on_sigterm,
    subprocess_group,
    tail,
    wait_for_worker,
    worker_argv,
    workspace,
)
from bench.rounds import calibrate, disturbed, in_turn, interpreter, machine_pace, pace_line
from bench.stack import FlowbeatStack, post_jobs, start_flowbeat, wait_final
from service.platform.constants import QUEUE_CONTROL, QUEUE_STEPS

IO_PIPELINE = "bench_io_chain"
SIDES = {"prefork-2": ("prefork", 2), "threads-2": ("threads", 2), "threads-8": ("threads", 8)}
BASE_SIDE = "prefork-2"
CLIENT_THREADS = 4
TIMEOUT_S = 300.0


def io_profile(url: str) -> str:
    step = "    action: http.request\n    with:\n      url: " + url + "\n"
    return (
        f"name: {IO_PIPELINE}\n"
        "description: three steps that each wait on a slow local endpoint, for bench.pools\n"
        "steps:\n"
        f"  - id: a\n{step}"
        f"  - id: b\n{step}    depends_on: [a]\n"
        f"  - id: c\n{step}    depends_on: [b]\n"
    )


@contextmanager
def slow_endpoint(wait_s: float) -> Iterator[str]:
    """A local HTTP endpoint that answers ``{}`` after ``wait_s``, as a remote API would."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            time.sleep(wait_s)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/slow"
    finally:
        server.shutdown()
        server.server_close()


class Bench:
    """The shared stack, and how many jobs it has finished so far (``wait_final`` counts all)."""

    def __init__(self, fb: FlowbeatStack, tmp: Path, args: argparse.Namespace) -> None:
        self.fb = fb
        self.tmp = tmp
        self.args = args
        self.finished = 0
        self.control = Celery("bench-control", broker=fb.env["FLOWBEAT_BROKER_URL"])

    def side(self, name: str, number: int) -> dict[str, Any]:
        pool, concurrency = SIDES[name]
        node = f"bench-pools-{os.getpid()}-{name}-{number}@{socket.gethostname()}"
        log_path = self.tmp / f"worker-{name}-{number}.log"
        argv = worker_argv("tasks.app", f"{QUEUE_STEPS},{QUEUE_CONTROL}", node, pool, concurrency)
        with subprocess_group(argv, self.fb.env, log_path, f"{name} worker") as proc:
            wait_for_worker(self.control, node, proc, log_path)
            noop = self.workload(proc.pid, PIPELINE, self.args.jobs, log_path)
            io = self.workload(proc.pid, IO_PIPELINE, self.args.io_jobs, log_path)
            pss_kib_sum = sum(pss_kib(p) for p in (proc.pid, *descendants(proc.pid)))
        return {"noop": noop, "io": io, "pss_mib": pss_kib_sum / 1024}

    def workload(self, pid: int, pipeline: str, jobs: int, log_path: Path) -> dict[str, float]:
        meter = CpuMeter({"worker": [pid]}, self.fb.conn)
        errors: list[str] = []
        meter.start()
        started = time.perf_counter()
        post_jobs(self.fb.base_url, self.fb.key, jobs, CLIENT_THREADS, [], errors, pipeline)
        if errors:
            raise RuntimeError(f"POSTs failed: {errors[:3]}")
        self.finished += jobs
        deadline = time.monotonic() + TIMEOUT_S
        counts = wait_final(self.fb.conn, self.finished, deadline, self.fb.dead)
        wall_s = time.perf_counter() - started
        cpu = meter.stop()
        if set(counts) != {"succeeded"}:
            raise RuntimeError(f"jobs not all succeeded: {counts}\n{tail(log_path)}")
        return {
            "jobs_per_s": jobs / wall_s,
            "worker_cpu_ms_per_job": 1000 * cpu["worker"] / jobs,
            "postgres_cpu_ms_per_job": 1000 * cpu["postgres"] / jobs,
        }


def _ratios(r: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Each side's rate and worker CPU a job over ``prefork-2``'s in the same round."""
    base = r[BASE_SIDE]
    return {
        f"{name}/{work}": {
            "rate": r[name][work]["jobs_per_s"] / base[work]["jobs_per_s"],
            "worker_cpu": r[name][work]["worker_cpu_ms_per_job"]
            / base[work]["worker_cpu_ms_per_job"],
        }
        for name in SIDES
        if name != BASE_SIDE
        for work in ("noop", "io")
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.pools",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--jobs", type=int, default=300, help="no-op chains a side and round")
    parser.add_argument("--io-jobs", type=int, default=60, help="waiting chains a side and round")
    parser.add_argument("--io-wait-ms", type=float, default=50.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, on_sigterm)
    rounds: list[dict[str, Any]] = []
    with ExitStack() as stack:
        ws = workspace(stack, "pools")
        url = stack.enter_context(slow_endpoint(args.io_wait_ms / 1000))
        egress = {
            "FLOWBEAT_EGRESS_ALLOW_HTTP": "true",
            "FLOWBEAT_EGRESS_ALLOWED_HOSTS": "127.0.0.1",
            "FLOWBEAT_EGRESS_INTERNAL_HOSTS": "127.0.0.1",
        }
        profiles = {PIPELINE: PROFILE_YAML, IO_PIPELINE: io_profile(url)}
        fb = start_flowbeat(stack, profiles, ws.fresh_redis(1), ws.admin_db, ws.tmp, egress, 0)
        bench = Bench(fb, ws.tmp, args)
        for number in range(args.rounds):
            before = calibrate()
            sides: dict[str, Callable[[], dict[str, Any]]] = {
                name: partial(bench.side, name, number) for name in SIDES
            }
            measured = in_turn(number, sides)
            after = calibrate()
            r = {**measured, "calibration": {"before": before, "after": after}}
            r["ratios"] = _ratios(r)
            rounds.append(r)
            log(f"round {number + 1}: {json.dumps(r)}")
        figures = _figures(rounds)
        if args.json:
            print(json.dumps(figures, indent=2), flush=True)
        else:
            _print(args, figures)
    return 0


def _figures(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    loops = [r["calibration"][m]["loop_ms"] for r in rounds for m in ("before", "after")]
    for r in rounds:
        r["disturbed"] = disturbed(
            r["calibration"]["before"], r["calibration"]["after"], min(loops)
        )
    clean = [r for r in rounds if not r["disturbed"]] or rounds
    medians = {
        key: {part: statistics.median(r["ratios"][key][part] for r in clean) for part in values}
        for key, values in rounds[0]["ratios"].items()
    }
    return {
        "python": interpreter(),
        "pace": machine_pace(loops),
        "steps_per_job": STEPS_PER_JOB,
        "median_of": "undisturbed rounds" if clean is not rounds else "all rounds (all disturbed)",
        "median_ratios": medians,
        "rounds": rounds,
    }


def _print(args: argparse.Namespace, figures: dict[str, Any]) -> None:
    print(
        f"\nworker pools, {len(figures['rounds'])} rounds: {args.jobs} no-op chains and "
        f"{args.io_jobs} chains of {args.io_wait_ms:g} ms waits a side; {interpreter()}; "
        f"ratios to {BASE_SIDE}, medians of {figures['median_of']}:"
    )
    for key, ratio in figures["median_ratios"].items():
        print(f"  {key:14}: rate {ratio['rate']:.2f}, worker CPU a job {ratio['worker_cpu']:.2f}")
    for number, r in enumerate(figures["rounds"], 1):
        before, after = r["calibration"]["before"], r["calibration"]["after"]
        print(
            f"  round {number} (loop {before['loop_ms']:.0f}/{after['loop_ms']:.0f} ms, background "
            f"{before['background_cores']:.2f}/{after['background_cores']:.2f} cores)"
            f"{' DISTURBED' if r['disturbed'] else ''}"
        )
        for name in SIDES:
            side = r[name]
            works = "; ".join(
                f"{work} {side[work]['jobs_per_s']:.1f} jobs/s, worker "
                f"{side[work]['worker_cpu_ms_per_job']:.2f} ms, PostgreSQL "
                f"{side[work]['postgres_cpu_ms_per_job']:.2f} ms a job"
                for work in ("noop", "io")
            )
            print(f"    {name:9}: {works}; worker PSS {side['pss_mib']:.0f} MiB")
    print(pace_line(figures["pace"]), flush=True)


if __name__ == "__main__":
    sys.exit(main())
