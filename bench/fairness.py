"""``python -m bench.fairness``: pacing, side by side in one run.

1. Fair share: a large owner posts a backlog, then a small owner posts a few jobs while it
   drains; the small owner's p50/p99 wait (from its job's creation to its first step's start)
   with ``FLOWBEAT_FAIR_SHARE_AHEAD`` off and on.
2. The cost of pacing: persisted steps a second, and the CPU time a step costs the API, the
   worker and PostgreSQL, for plain jobs, jobs at mixed priorities, and jobs of a profile with
   a concurrency key whose limit never binds (the admission path alone), against plain
   dispatch. ``--py-spy DIR`` profiles the API and the worker of each side's first round.

The sides alternate round by round, each on a fresh database and Redis DB, and the run prints
a CPU calibration beside its figures: the VM's speed drifts within a run.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.cpu import CpuMeter
from bench.harness import (
    STEPS_PER_JOB,
    log,
    on_sigterm,
    pct,
    py_spy,
    subprocess_group,
    workspace,
)
from bench.rounds import calibrate
from bench.stack import FlowbeatStack, start_flowbeat, wait_final

ONE_STEP = """\
name: {name}
steps:
  - id: a
    action: noop
"""
CHAIN = """\
name: {name}
{extra}steps:
  - id: a
    action: noop
  - id: b
    action: noop
    depends_on: [a]
  - id: c
    action: noop
    depends_on: [b]
"""
KEYED = (
    "params:\n  tenant: {type: string, default: t}\n"
    "concurrency: {key: '${{ params.tenant }}', limit: 10000}\n"
)


POSTERS = 8


@dataclass
class Waits:
    p50_s: float
    p99_s: float
    small_jobs: int


def _beat(stack: ExitStack, fb: FlowbeatStack, name: str) -> None:
    schedule = fb.api_log.parent / f"beat-{name}"
    argv = [sys.executable, "-m", "celery", "-A", "tasks.app", "beat", f"--schedule={schedule}"]
    argv += ["-S", "scheduler.beat:FlowbeatScheduler", "--loglevel=WARNING"]
    stack.enter_context(subprocess_group(argv, fb.env, fb.api_log.parent / f"{name}.log", "beat"))


def _owner_key(fb: FlowbeatStack, owner: str) -> str:
    from service.platform.auth import create_api_key
    from service.platform.db import make_engine, make_session_factory, unit_of_work

    engine = make_engine(fb.env["FLOWBEAT_DATABASE_URL"], pool_size=1)
    try:
        with unit_of_work(make_session_factory(engine)) as session:
            key, _ = create_api_key(session, owner=owner, scopes=["write", "read"])
    finally:
        engine.dispose()
    return key


def _post(client: httpx.Client, key: str, pipeline: str, **body: Any) -> None:
    response = client.post(
        "/v1/jobs",
        json={"pipeline": pipeline, **body},
        headers={"Authorization": f"Bearer {key}"},
    )
    if response.status_code != 202:
        raise RuntimeError(f"{response.status_code} {response.text[:200]}")


def _post_all(base_url: str, key: str, bodies: list[dict[str, Any]]) -> None:
    """Faster than the workers drain them, so a backlog builds: ``POSTERS`` clients at once."""
    pending = iter(bodies)
    lock = threading.Lock()

    def client_loop() -> None:
        with httpx.Client(base_url=base_url, timeout=60) as client:
            while True:
                with lock:
                    body = next(pending, None)
                if body is None:
                    return
                _post(client, key, **body)

    with ThreadPoolExecutor(max_workers=POSTERS) as pool:
        for future in [pool.submit(client_loop) for _ in range(POSTERS)]:
            future.result()


def fair_share_round(args: argparse.Namespace, ahead: int, redis_url: str, tmp: Any) -> Waits:
    with ExitStack() as stack:
        fb = start_flowbeat(
            stack,
            {"turns": ONE_STEP.format(name="turns")},
            redis_url,
            args.admin_db,
            tmp,
            settings={"FLOWBEAT_FAIR_SHARE_AHEAD": str(ahead)},
        )
        _beat(stack, fb, f"beat-{ahead}")
        big, small = _owner_key(fb, "big"), _owner_key(fb, "small")
        _post_all(fb.base_url, big, [{"pipeline": "turns"}] * args.backlog)
        with httpx.Client(base_url=fb.base_url, timeout=60) as client:
            for _ in range(args.small):
                _post(client, small, "turns")
                time.sleep(args.small_every_s)
        wait_final(fb.conn, args.backlog + args.small, time.monotonic() + args.timeout_s, fb.dead)
        rows = fb.conn.execute(
            """SELECT extract(epoch FROM s.started_at - j.created_at)
                 FROM jobs AS j JOIN step_runs AS s ON s.job_id = j.id AND s.step_id = 'a'
                WHERE j.owner = 'small'"""
        ).fetchall()
    waits = [float(row[0]) for row in rows]
    return Waits(pct(waits, 0.5), pct(waits, 0.99), len(waits))


def throughput_round(
    args: argparse.Namespace, side: str, redis_url: str, tmp: Any, spy_dir: Path | None
) -> dict[str, Any]:
    """Persisted steps a second for ``args.jobs`` chains posted at once, and the CPU time the
    API, the worker and PostgreSQL spent a step: on a VM shared with other work the rate
    swings with that work, the CPU a step costs much less."""
    extra = KEYED if side == "concurrency key" else ""
    with ExitStack() as stack:
        fb = start_flowbeat(
            stack, {"paced": CHAIN.format(name="paced", extra=extra)}, redis_url, args.admin_db, tmp
        )
        rng = random.Random(7)
        bodies = [
            {
                "pipeline": "paced",
                **({"priority": rng.randint(0, 9)} if side == "priorities" else {}),
            }
            for _ in range(args.jobs)
        ]
        name = side.replace(" ", "-")
        stack.enter_context(py_spy(spy_dir, fb.api.pid, f"{name}-api"))
        stack.enter_context(py_spy(spy_dir, fb.worker.pid, f"{name}-worker"))
        meter = CpuMeter({"api": [fb.api.pid], "workers": [w.pid for w in fb.workers]}, fb.conn)
        meter.start()
        started = time.perf_counter()
        _post_all(fb.base_url, fb.key, bodies)
        wait_final(fb.conn, args.jobs, time.monotonic() + args.timeout_s, fb.dead)
        elapsed = time.perf_counter() - started
        steps = STEPS_PER_JOB * args.jobs
        cpu = {part: s * 1000 / steps for part, s in meter.stop().items() if part != "client"}
        return {"steps_per_s": steps / elapsed, "cpu_ms_per_step": cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlog", type=int, default=300)
    parser.add_argument("--small", type=int, default=20)
    parser.add_argument("--small-every-s", type=float, default=0.05)
    parser.add_argument("--ahead", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=600)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--py-spy",
        type=Path,
        default=None,
        metavar="DIR",
        help="profile the API and the worker of each side's first throughput round into DIR",
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, on_sigterm)
    results: dict[str, Any] = {"calibration": [calibrate()], "fair_share": {}, "throughput": {}}
    with ExitStack() as stack:
        ws = workspace(stack, "fairness")
        args.admin_db = ws.admin_db
        for n in range(args.rounds):
            for ahead in (0, args.ahead) if n % 2 == 0 else (args.ahead, 0):
                side = "on" if ahead else "off"
                log(f"round {n + 1}: fair share {side}")
                waits = fair_share_round(args, ahead, ws.fresh_redis(0), ws.tmp)
                results["fair_share"].setdefault(side, []).append(waits.__dict__)
            sides = ["plain", "priorities", "concurrency key"]
            for side in sides if n % 2 == 0 else sides[::-1]:
                log(f"round {n + 1}: throughput, {side}")
                spy_dir = args.py_spy if n == 0 else None
                rate = throughput_round(args, side, ws.fresh_redis(1), ws.tmp, spy_dir)
                results["throughput"].setdefault(side, []).append(rate)
            results["calibration"].append(calibrate())
    _report(args, results)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _report(args: argparse.Namespace, results: dict[str, Any]) -> None:
    if args.json:
        print(json.dumps(results, indent=2))
        return
    loops = [c["loop_ms"] for c in results["calibration"]]
    print(f"CPU calibration loop: {min(loops):.1f}-{max(loops):.1f} ms over the run")
    print(f"\nFair share: {args.backlog} jobs of one owner, then {args.small} of another")
    for side in ("off", "on"):
        runs = results["fair_share"][side]
        p50 = _median([r["p50_s"] for r in runs])
        p99 = _median([r["p99_s"] for r in runs])
        label = f"on (ahead {args.ahead})" if side == "on" else "off"
        print(f"  {label:<16} small owner's wait p50 {p50:7.2f} s  p99 {p99:7.2f} s")
    runs = results["throughput"]
    rates = {side: _median([r["steps_per_s"] for r in runs[side]]) for side in runs}
    cpu = {side: _median([sum(r["cpu_ms_per_step"].values()) for r in runs[side]]) for side in runs}
    print(f"\nThroughput, {args.jobs} chains of {STEPS_PER_JOB} no-op steps")
    print(
        f"  {'':<16} {'steps/s':>8}   {'':>11}   {'CPU ms/step':>11}   (API + worker + PostgreSQL)"
    )
    for side in ("plain", "priorities", "concurrency key"):
        rounds = ", ".join(f"{r['steps_per_s']:.0f}" for r in runs[side])
        print(
            f"  {side:<16} {rates[side]:8.1f}   {rates[side] / rates['plain']:5.2f}x plain"
            f"   {cpu[side]:11.2f}   {cpu[side] / cpu['plain']:5.2f}x plain   (rounds {rounds})"
        )


if __name__ == "__main__":
    main()
