"""Enqueue latency of one API process at a fixed arrival rate.

    python -m bench.enqueue [--rate 500] [--seconds 10] [--with-worker] [--py-spy DIR] [--json]

The chain bench's clients are closed-loop (each waits for its answer before it sends the
next), so a slow answer lowers the rate it measures at. Here requests arrive on a fixed
schedule, request i at ``i / rate`` seconds, sent by enough client threads that one slow
answer does not hold the next back, and each latency is counted from the moment the request
was due, not from when it was sent, so queueing in the client counts against the API too.
One API process (uvicorn), a fresh database, a Redis DB; ``--with-worker`` also runs the
worker, as in production, which shares the two cores. The CPU calibration of
``bench.chain_throughput`` is printed before and after.
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
from urllib.parse import urlsplit

from bench.chain_throughput import (
    PIPELINE,
    PROFILE_YAML,
    calibrate,
    log,
    on_sigterm,
    pct,
    py_spy,
    start_flowbeat,
    workspace,
)

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
    parser.add_argument("--with-worker", action="store_true")
    parser.add_argument("--py-spy", type=Path, default=None, help="write flame graphs here")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, on_sigterm)
    before = calibrate()
    with ExitStack() as stack:
        ws = workspace(stack, "enqueue")
        fb = start_flowbeat(stack, {PIPELINE: PROFILE_YAML}, ws.fresh_redis(1), ws.admin_db, ws.tmp)
        if not args.with_worker:
            fb.worker.terminate()
            fb.worker.wait(timeout=30)
        fire(fb.base_url, fb.key, args.rate, 1.0)
        with py_spy(args.py_spy, fb.api.pid, "enqueue-api"):
            latencies, errors = fire(fb.base_url, fb.key, args.rate, args.seconds)
    after = calibrate()
    ms = sorted(x * 1000 for x in latencies)
    figures = {
        "rate_jobs_per_s": args.rate,
        "seconds": args.seconds,
        "with_worker": args.with_worker,
        "accepted": len(ms),
        "errors": errors,
        "p50_ms": statistics.median(ms) if ms else None,
        "p99_ms": pct(ms, 0.99) if ms else None,
        "max_ms": ms[-1] if ms else None,
        "calibration": {"before": before, "after": after},
    }
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        worker = "with the worker running" if args.with_worker else "API alone"
        print()
        print(
            f"enqueue at {args.rate:.0f} jobs/s for {args.seconds:.0f} s, one API process, {worker}"
        )
        print(
            f"  accepted {len(ms)}, errors {errors}; latency from due time "
            f"p50 {figures['p50_ms']:.1f} ms, p99 {figures['p99_ms']:.1f} ms, "
            f"max {figures['max_ms']:.0f} ms"
        )
        print(
            f"  calibration: loop {before['loop_ms']:.0f} ms before, {after['loop_ms']:.0f} ms "
            f"after; background {before['background_cores']:.2f}/"
            f"{after['background_cores']:.2f} cores; load {before['load_1m']:.2f} before, "
            f"{after['load_1m']:.2f} after"
        )
    log("done")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
