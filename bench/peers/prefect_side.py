"""Prefect 3 with a local server (``prefect server start``, on a fresh PostgreSQL database, as
its docs advise beyond light use; results on the local disk of a fresh ``PREFECT_HOME``):
1,000 runs of a flow of three tasks, every result persisted, and a flow mapping a task over
10,000 items with a gather.

    .venv-peers/bin/python -m bench.peers.prefect_side --chains N --fanout M --tmp DIR

Run by ``bench.peers`` in the peers' venv; prints its figures as one JSON line. Flows run
where they are called: as many runner processes as the run's concurrency each run their
share of the flows one after another (a deployment's worker would start a process per flow
run, far slower). The runners are started and warmed up first, then all told to go at once:
a flow's latency is from then to its last task's end. Runners start no flow past
``--budget``: the figures are then of the flows that ran, and say how many. The fan-out
runs in one more runner; past ``--fanout-timeout`` it is stopped and reported as not
finished.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import psycopg

from bench.cpu import CpuMeter
from bench.harness import (
    REPO,
    _libpq,
    free_port,
    fresh_database,
    log,
    on_sigterm,
    subprocess_group,
    tail,
)
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

GO = "go\n"
ITEMS_DONE = "SELECT count(*) FROM task_run WHERE state_type = 'COMPLETED' AND name LIKE 'item-%'"


def runner(flows: int, items: int, budget_s: float) -> None:
    """One runner process: warm up, say ready, wait for the word, then run up to ``flows``
    chain flows within ``budget_s`` (printing when each ended and the CPU it spent: it is
    gone before the side's meter stops) or one fan-out flow of ``items``."""
    from bench.peers import prefect_app

    prefect_app.chain()
    print("ready", flush=True)
    sys.stdin.readline()
    if items:
        started = time.perf_counter()
        prefect_app.fan_out(items)
        print(json.dumps({"wall_s": time.perf_counter() - started}), flush=True)
        return
    cpu0, deadline = time.process_time(), time.monotonic() + budget_s
    ends: list[float] = []
    while len(ends) < flows and time.monotonic() < deadline:
        ends.append(prefect_app.chain())
    print(json.dumps({"ends": ends, "cpu_s": time.process_time() - cpu0}), flush=True)


def _server(stack: ExitStack, env: dict[str, str], tmp: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1"]
    argv += ["--port", env["BENCH_PREFECT_PORT"]]
    log_path = tmp / "prefect-server.log"
    server = stack.enter_context(subprocess_group(argv, env, log_path, "prefect server"))
    health = f"{env['PREFECT_API_URL']}/health"

    def healthy() -> bool:
        if server.poll() is not None:
            raise RuntimeError(f"prefect server exited:\n{tail(log_path)}")
        try:
            return httpx.get(health, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(healthy, time.monotonic() + 120, "prefect server start", poll_s=0.5)
    return server


def _runners(
    stack: ExitStack, env: dict[str, str], shares: list[tuple[int, int]], tmp: Path
) -> list[subprocess.Popen[str]]:
    procs = []
    for index, (flows, items) in enumerate(shares):
        argv = [sys.executable, "-m", "bench.peers.prefect_side", "--runner"]
        argv += [str(flows), str(items), env["BENCH_PREFECT_BUDGET_S"]]
        err = stack.enter_context((tmp / f"prefect-runner-{index}.log").open("w"))
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
        )
        stack.callback(proc.kill)
        procs.append(proc)
    for proc in procs:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"a prefect runner failed to start:\n{tail(Path(err.name))}")
    return procs


def _go(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(GO)
        proc.stdin.flush()


def main(argv: list[str] | None = None) -> int:
    if argv is None and sys.argv[1:2] == ["--runner"]:
        runner(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
        return 0
    args = peer_parser("bench.peers.prefect_side", __doc__).parse_args(argv)
    signal.signal(signal.SIGTERM, on_sigterm)
    port = str(free_port())
    stack = ExitStack()
    db_url = stack.enter_context(fresh_database(args.admin_db))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")},
        "PYTHONPATH": str(REPO),
        "BENCH_PREFECT_PORT": port,
        "BENCH_CONCURRENCY": str(args.concurrency),
        "BENCH_PREFECT_BUDGET_S": str(args.budget),
        "PREFECT_API_DATABASE_CONNECTION_URL": db_url.replace("+psycopg", "+asyncpg", 1),
        "PREFECT_HOME": str(args.tmp / "prefect"),
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
        "PREFECT_RESULTS_PERSIST_BY_DEFAULT": "true",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
        "PREFECT_LOGGING_LEVEL": "WARNING",
    }
    result = SideResult("prefect")
    with stack:
        server = _server(stack, env, args.tmp)
        share = [args.chains // args.concurrency] * args.concurrency
        share[0] += args.chains - sum(share)
        procs = _runners(stack, env, [(n, 0) for n in share], args.tmp)
        log(f"prefect: {args.chains} flows of 3 tasks in {args.concurrency} runners")
        conn = stack.enter_context(psycopg.connect(_libpq(db_url), autocommit=True))
        meter = CpuMeter({"api": [server.pid]}, conn)
        with PeakPss([server.pid, *(p.pid for p in procs)]) as peak:
            meter.start()
            t0 = time.time()
            _go(procs)
            ends, cpu_s = [], 0.0
            for proc in procs:
                out, _ = proc.communicate(timeout=args.timeout + 120)
                figures = json.loads(out.splitlines()[-1])
                ends += figures["ends"]
                cpu_s += figures["cpu_s"]
            cpu = {**meter.stop(), "worker": cpu_s}
        cpu["db"] = cpu.pop("postgres")
        cpu["client"] -= peak.cpu_s
        latencies = [end - t0 for end in ends]
        result.chains = chains_result(len(ends), max(ends) - t0, latencies, cpu, peak.mib)
        if len(ends) < args.chains:
            result.note = f"{len(ends)} of {args.chains} flows ran within {args.budget:.0f} s"
        log(f"prefect: a flow mapping a task over {args.fanout} items, then a gather")
        (fan,) = _runners(stack, env, [(0, args.fanout)], args.tmp)
        started = time.perf_counter()
        _go([fan])
        try:
            out, _ = fan.communicate(timeout=args.fanout_timeout)
            result.fanout = fanout_result(args.fanout, json.loads(out.splitlines()[-1])["wall_s"])
        except subprocess.TimeoutExpired:
            row = conn.execute(ITEMS_DONE).fetchone()
            result.fanout = partial_fanout(
                args.fanout, int(row[0]) if row else 0, started, args.fanout_timeout
            )
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
