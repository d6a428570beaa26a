"""``python -m bench.step_cache``: what the step cache costs, side by side in one run.

Chains of three no-op steps whose inputs read a param, posted at once, on the real stack:

- ``plain``: no step declares ``cache`` (every job its own param value);
- ``cache miss``: every step declares ``cache``, every job its own param value, so each step
  looks the cache up, runs its action and leaves an entry (each step's inputs name it, or the
  second step would take the first's output: same action, same inputs);
- ``cache hit``: the same profile, every job the same value, one job run before the timed
  part, so each step takes its output from the cache instead of running.

For each: persisted steps a second, and the CPU time a step costs the API, the worker and
PostgreSQL, against plain. The sides alternate round by round, each on a fresh database and
Redis DB, with a CPU calibration beside the figures: the VM's speed drifts within a run.
"""

from __future__ import annotations

import argparse
import json
import signal
import time
import uuid
from contextlib import ExitStack
from typing import Any

from bench.cpu import CpuMeter
from bench.fairness import _median, _post_all
from bench.harness import STEPS_PER_JOB, log, on_sigterm, workspace
from bench.rounds import calibrate
from bench.stack import start_flowbeat, wait_final

SIDES = ("plain", "cache miss", "cache hit")
STEP = """\
  - id: {id}
    action: noop
    with: {{step: {id}, topic: '${{{{ params.topic }}}}'}}
{cache}{depends}"""
CACHE = "    cache: {ttl_s: 86400}\n"


def profile_yaml(name: str, cached: bool) -> str:
    steps = "".join(
        STEP.format(
            id=step,
            cache=CACHE if cached else "",
            depends=f"    depends_on: [{before}]\n" if before else "",
        )
        for step, before in (("a", None), ("b", "a"), ("c", "b"))
    )
    return f"name: {name}\nparams:\n  topic: {{type: string}}\nsteps:\n{steps}"


def throughput_round(args: argparse.Namespace, side: str, redis_url: str, tmp: Any) -> Any:
    """Persisted steps a second for ``args.jobs`` chains posted at once, and the CPU a step
    costs the API, the worker and PostgreSQL."""
    name = "cached" if side != "plain" else "plain"
    with ExitStack() as stack:
        fb = start_flowbeat(
            stack, {name: profile_yaml(name, side != "plain")}, redis_url, args.admin_db, tmp
        )
        warm = 0
        if side == "cache hit":
            _post_all(fb.base_url, fb.key, [{"pipeline": name, "params": {"topic": "same"}}])
            wait_final(fb.conn, 1, time.monotonic() + args.timeout_s, fb.dead)
            warm = 1
        topics = ["same" if side == "cache hit" else uuid.uuid4().hex for _ in range(args.jobs)]
        bodies = [{"pipeline": name, "params": {"topic": topic}} for topic in topics]
        meter = CpuMeter({"api": [fb.api.pid], "workers": [w.pid for w in fb.workers]}, fb.conn)
        meter.start()
        started = time.perf_counter()
        _post_all(fb.base_url, fb.key, bodies)
        wait_final(fb.conn, warm + args.jobs, time.monotonic() + args.timeout_s, fb.dead)
        elapsed = time.perf_counter() - started
        steps = STEPS_PER_JOB * args.jobs
        cpu = {part: s * 1000 / steps for part, s in meter.stop().items() if part != "client"}
        row = fb.conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'cached'), count(*) FROM step_runs"
        ).fetchone()
        assert row is not None
        return {"steps_per_s": steps / elapsed, "cpu_ms_per_step": cpu, "cached": row[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=600)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, on_sigterm)
    results: dict[str, Any] = {"calibration": [calibrate()], "throughput": {}}
    with ExitStack() as stack:
        ws = workspace(stack, "step-cache")
        args.admin_db = ws.admin_db
        for n in range(args.rounds):
            for side in SIDES if n % 2 == 0 else SIDES[::-1]:
                log(f"round {n + 1}: {side}")
                rate = throughput_round(args, side, ws.fresh_redis(1), ws.tmp)
                results["throughput"].setdefault(side, []).append(rate)
            results["calibration"].append(calibrate())
    _report(args, results)


def _report(args: argparse.Namespace, results: dict[str, Any]) -> None:
    if args.json:
        print(json.dumps(results, indent=2))
        return
    loops = [c["loop_ms"] for c in results["calibration"]]
    print(f"CPU calibration loop: {min(loops):.1f}-{max(loops):.1f} ms over the run")
    runs = results["throughput"]
    rates = {side: _median([r["steps_per_s"] for r in runs[side]]) for side in runs}
    cpu = {side: _median([sum(r["cpu_ms_per_step"].values()) for r in runs[side]]) for side in runs}
    print(f"\n{args.jobs} chains of {STEPS_PER_JOB} no-op steps, side by side")
    print(f"  {'':<12} {'steps/s':>8}   {'':>11}   {'CPU ms/step':>11}   (API + worker + PG)")
    for side in SIDES:
        rounds = ", ".join(f"{r['steps_per_s']:.0f}" for r in runs[side])
        cached = ", ".join(str(r["cached"]) for r in runs[side])
        print(
            f"  {side:<12} {rates[side]:8.1f}   {rates[side] / rates['plain']:5.2f}x plain"
            f"   {cpu[side]:11.2f}   {cpu[side] / cpu['plain']:5.2f}x plain"
            f"   (rounds {rounds}; steps cached {cached})"
        )


if __name__ == "__main__":
    main()
