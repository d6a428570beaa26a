"""Dramatiq: the 3-step chain as a ``pipeline`` of no-op messages (``pipe_ignore``: a step
takes no input), the fan-out as a ``group`` with a completion callback, on a Redis broker.

    .venv-peers/bin/python -m bench.peers.dramatiq_side --chains N --fanout M --redis-url URL ...

Run by ``bench.peers`` in the peers' venv; prints its figures as one JSON line. The worker is
``dramatiq`` with ``--processes`` of the run's concurrency and one thread each, so as many
messages run at once as on every other side.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from contextlib import ExitStack
from typing import Any

from bench.cpu import CpuMeter
from bench.harness import REPO, log, on_sigterm, subprocess_group
from bench.peers.measure import (
    PeakPss,
    SideResult,
    broker_roots,
    chains_result,
    emit,
    fanout_result,
    peer_parser,
)

STEPS = 3


def main(argv: list[str] | None = None) -> int:
    args = peer_parser("bench.peers.dramatiq_side", __doc__).parse_args(argv)
    signal.signal(signal.SIGTERM, on_sigterm)
    os.environ["BENCH_PEERS_REDIS_URL"] = args.redis_url
    from dramatiq import group, pipeline

    from bench.peers import dramatiq_app as app

    wait_ms = int(args.timeout * 1000)

    def chains(count: int) -> tuple[list[float], list[Any]]:
        starts, pipes = [], []
        for _ in range(count):
            steps = [app.noop.message_with_options(pipe_ignore=True) for _ in range(STEPS - 1)]
            steps.append(app.noop.message_with_options(pipe_ignore=True, store_results=True))
            starts.append(time.time())
            pipes.append(pipeline(steps).run())
        return starts, pipes

    def ends(pipes: list[Any]) -> list[float]:
        return [float(p.get_result(block=True, timeout=wait_ms)) for p in pipes]

    def fan_out(items: int) -> float:
        started = time.perf_counter()
        callback = app.gather.message_with_options(store_results=True)
        fan = group([app.noop.message() for _ in range(items)])
        fan.add_completion_callback(callback)
        fan.run()
        callback.get_result(block=True, timeout=int(args.fanout_timeout * 1000))
        return time.perf_counter() - started

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv_worker = [sys.executable, "-m", "dramatiq", "bench.peers.dramatiq_app"]
    argv_worker += ["--processes", str(args.concurrency), "--threads", "1"]
    with ExitStack() as stack:
        worker = stack.enter_context(
            subprocess_group(argv_worker, env, args.tmp / "dramatiq.log", "dramatiq worker")
        )
        ends(chains(args.warmup)[1])
        fan_out(50)
        log(f"dramatiq: {args.chains} pipelines of {STEPS} no-op messages")
        meter = CpuMeter({"worker": [worker.pid], **broker_roots(args.redis_pid)})
        with PeakPss([worker.pid]) as peak:
            meter.start()
            t0 = time.time()
            starts, pipes = chains(args.chains)
            finished = ends(pipes)
            cpu = meter.stop()
        wall = max(finished) - t0
        cpu["client"] -= peak.cpu_s
        latencies = [end - start for start, end in zip(starts, finished, strict=True)]
        result = SideResult("dramatiq")
        result.chains = chains_result(args.chains, wall, latencies, cpu, peak.mib)
        log(f"dramatiq: a group of {args.fanout} messages with a completion callback")
        result.fanout = fanout_result(args.fanout, fan_out(args.fanout))
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
