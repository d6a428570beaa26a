"""Enqueue latency of one API process at a fixed arrival rate.

    python -m bench.enqueue [--rate 500] [--seconds 10] [--rounds 5] [--with-worker]
                            [--py-spy DIR] [--json]

The chain bench's clients are closed-loop (each waits for its answer before it sends the
next), so a slow answer lowers the rate it measures at. Here requests arrive on a fixed
schedule, request i at ``i / rate`` seconds, sent by enough client threads that one slow
answer does not hold the next back, each on a connection it opened before the clock started.
Each latency is counted from the moment the request was due, not from when it was sent, so
queueing in the client counts against the API too. One API process started as deployments
start it (``flowbeat api``), a fresh database, a Redis DB; ``--with-worker`` also runs the
worker, as in production, which shares the two cores. The per-key rate limit is on, as in
production, set above the arrival rate. Each round is calibrated before and after as the
chain bench's are; a round run on a throttled or busy machine is printed as `DISTURBED` and
left out, and the median p99 of the other rounds is the figure.
"""

from __future__ import annotations

import argparse
import http.client
import json
import signal
import statistics
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.cpu import cpu_s
from bench.harness import PIPELINE, PROFILE_YAML, log, on_sigterm, pct, py_spy, workspace
from bench.rounds import calibrate, disturbed, interpreter, machine_pace, pace_line
from bench.stack import start_flowbeat

CLIENT_THREADS = 16


def fire(base_url: str, key: str, rate: float, seconds: float) -> tuple[list[float], int]:
    """Latencies (s) of the accepted requests, counted from when each was due, and errors."""
    total = int(rate * seconds)
    body = json.dumps({"pipeline": PIPELINE, "params": {}}).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    address = urlsplit(base_url)
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    counter = iter(range(total))
    start = time.perf_counter() + 0.5

    def client() -> None:
        conn = http.client.HTTPConnection(address.hostname or "", address.port, timeout=60.0)
        conn.connect()
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                break
            due = start + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            try:
                conn.request("POST", "/v1/jobs", body=body, headers=headers)
                answer = conn.getresponse()
                answer.read()
                ok = answer.status == 202
            except (OSError, http.client.HTTPException):
                conn.close()
                ok = False
            with lock:
                if ok:
                    latencies.append(time.perf_counter() - due)
                else:
                    errors[0] += 1
        conn.close()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(CLIENT_THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies, errors[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.enqueue",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rate", type=float, default=500.0, help="jobs per second")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=5, help="the median round is reported")
    parser.add_argument("--with-worker", action="store_true")
    parser.add_argument("--py-spy", type=Path, default=None, help="write flame graphs here")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, on_sigterm)
    rounds: list[dict[str, Any]] = []
    with ExitStack() as stack:
        ws = workspace(stack, "enqueue")
        fb = start_flowbeat(
            stack,
            {PIPELINE: PROFILE_YAML},
            ws.fresh_redis(1),
            ws.admin_db,
            ws.tmp,
            rate_limited(args.rate),
        )
        if not args.with_worker:
            fb.worker.terminate()
            fb.worker.wait(timeout=30)
        fire(fb.base_url, fb.key, args.rate, 1.0)
        for number in range(args.rounds):
            before = calibrate()
            api_cpu_s = cpu_s(fb.api.pid) or 0.0
            with py_spy(args.py_spy if number == 0 else None, fb.api.pid, "enqueue-api"):
                latencies, errors = fire(fb.base_url, fb.key, args.rate, args.seconds)
            api_cpu_s = (cpu_s(fb.api.pid) or 0.0) - api_cpu_s
            rounds.append(_round(latencies, errors, api_cpu_s, before, calibrate()))
            log(f"round {number + 1}: p99 {rounds[-1]['p99_ms']:.1f} ms")
    best = min(
        min(r["calibration"]["before"]["loop_ms"], r["calibration"]["after"]["loop_ms"])
        for r in rounds
    )
    for r in rounds:
        r["disturbed"] = disturbed(r["calibration"]["before"], r["calibration"]["after"], best)
    clean = [r for r in rounds if not r["disturbed"]] or rounds
    pace = machine_pace(
        [r["calibration"][moment]["loop_ms"] for r in rounds for moment in ("before", "after")]
    )
    figures = {
        "python": interpreter(),
        "pace": pace,
        "rate_jobs_per_s": args.rate,
        "seconds": args.seconds,
        "with_worker": args.with_worker,
        "median_p99_ms": statistics.median(float(r["p99_ms"]) for r in clean),
        "median_of": "undisturbed rounds"
        if clean is not rounds
        else "all rounds (every one disturbed)",
        "target_p99_ms": TARGET_P99_MS,
        "rounds": rounds,
    }
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        _print(args, figures, rounds)
        print(pace_line(pace))
    log("done")
    return 1 if any(r["errors"] for r in rounds) else 0


TARGET_P99_MS = 15.0


def rate_limited(rate: float) -> dict[str, str]:
    """The per-key limit on, as it is by default, but twice as high as the arrival rate: every
    request pays for its check and none is refused."""
    return {
        "FLOWBEAT_RATE_LIMIT_PER_S": f"{2 * rate:g}",
        "FLOWBEAT_RATE_LIMIT_BURST": str(int(4 * rate)),
    }


def _round(
    latencies: list[float],
    errors: int,
    api_cpu_s: float,
    before: dict[str, float],
    after: dict[str, float],
) -> dict[str, Any]:
    ms = sorted(x * 1000 for x in latencies)
    nan = float("nan")
    return {
        "accepted": len(ms),
        "api_cpu_ms_per_job": 1000 * api_cpu_s / len(ms) if ms else nan,
        "errors": errors,
        "p50_ms": statistics.median(ms) if ms else nan,
        "p99_ms": pct(ms, 0.99) if ms else nan,
        "max_ms": ms[-1] if ms else nan,
        "calibration": {"before": before, "after": after},
    }


def _print(args: argparse.Namespace, figures: dict[str, Any], rounds: list[Any]) -> None:
    worker = "with the worker running" if args.with_worker else "API alone"
    print()
    print(
        f"enqueue at {args.rate:.0f} jobs/s, {len(rounds)} rounds of {args.seconds:.0f} s, "
        f"one API process, {worker}, {interpreter()}: median p99 {figures['median_p99_ms']:.1f} ms "
        f"of {figures['median_of']} "
        f"(target < {TARGET_P99_MS:.0f} ms)"
    )
    for r in rounds:
        before, after = r["calibration"]["before"], r["calibration"]["after"]
        print(
            f"  accepted {r['accepted']}, errors {r['errors']}; latency from due time "
            f"p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, max {r['max_ms']:.0f} ms; "
            f"API CPU {r['api_cpu_ms_per_job']:.2f} ms a job "
            f"(loop {before['loop_ms']:.0f}/{after['loop_ms']:.0f} ms, background "
            f"{before['background_cores']:.2f}/{after['background_cores']:.2f} cores, "
            f"load {before['load_1m']:.2f}/{after['load_1m']:.2f})"
            f"{' DISTURBED' if r['disturbed'] else ''}"
        )


if __name__ == "__main__":
    sys.exit(main())
