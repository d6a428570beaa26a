"""A diamond with one slow branch: per-edge scheduling against layer-by-layer scheduling.

    python -m bench.diamond [--jobs 20] [--slow 0.6] [--step 0.2] [--json]

One flowbeat stack (API, one worker with prefork ``--concurrency 2``), two profiles of the
same steps: ``start``, then a chain ``fast1 -> fast2 -> fast3`` beside a ``slow`` step, then a
``join`` of both. In ``edges`` each step depends on what it uses, which is how flowbeat runs
every profile now. In ``layers`` every step of a layer also waits for the whole layer before
it, which is how flowbeat ran a DAG before (a Celery chain of groups): ``fast2`` waits for
``slow``. The jobs of the two profiles alternate; each job's makespan (POST to final, read
from PostgreSQL) and the moment its ``fast3`` finished are reported as medians.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from typing import Any

import httpx
import psycopg

from bench.harness import WORKER_CONCURRENCY, log, on_sigterm, workspace
from bench.stack import start_flowbeat

POLL_S = 0.02


def profile_yaml(name: str, layered: bool, slow_s: float, step_s: float) -> str:
    fast2_deps = "[fast1, slow]" if layered else "[fast1]"
    return f"""\
name: {name}
steps:
  - {{id: start, action: noop}}
  - {{id: fast1, action: sleep, depends_on: [start], with: {{seconds: {step_s}}}}}
  - {{id: slow, action: sleep, depends_on: [start], with: {{seconds: {slow_s}}}}}
  - {{id: fast2, action: sleep, depends_on: {fast2_deps}, with: {{seconds: {step_s}}}}}
  - {{id: fast3, action: sleep, depends_on: [fast2], with: {{seconds: {step_s}}}}}
  - {{id: join, action: noop, depends_on: [fast3, slow]}}
"""


@dataclass
class Run:
    makespan_s: float
    fast3_done_s: float


def _run_job(client: httpx.Client, conn: psycopg.Connection[Any], pipeline: str) -> Run:
    response = client.post("/v1/jobs", json={"pipeline": pipeline})
    if response.status_code != 202:
        raise RuntimeError(f"POST /v1/jobs: {response.status_code} {response.text[:300]}")
    job_id = response.json()["job"]["id"]
    deadline = time.monotonic() + 60
    while True:
        row = conn.execute(
            "SELECT status, created_at, finished_at FROM jobs WHERE id = %s", (job_id,)
        ).fetchone()
        assert row is not None
        if row[0] in ("succeeded", "failed", "cancelled"):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} not final")
        time.sleep(POLL_S)
    if row[0] != "succeeded":
        raise RuntimeError(f"job {job_id} {row[0]}")
    fast3 = conn.execute(
        "SELECT finished_at FROM step_runs WHERE job_id = %s AND step_id = 'fast3'", (job_id,)
    ).fetchone()
    assert fast3 is not None
    created = row[1]
    return Run((row[2] - created).total_seconds(), (fast3[0] - created).total_seconds())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.diamond",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--jobs", type=int, default=20, help="jobs of each profile")
    parser.add_argument("--slow", type=float, default=0.6, help="seconds of the slow step")
    parser.add_argument("--step", type=float, default=0.2, help="seconds of each fast step")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, on_sigterm)
    profiles = {
        name: profile_yaml(name, name == "diamond_layers", args.slow, args.step)
        for name in ("diamond_edges", "diamond_layers")
    }
    runs: dict[str, list[Run]] = {name: [] for name in profiles}
    with ExitStack() as stack:
        ws = workspace(stack, "diamond")
        fb = start_flowbeat(stack, profiles, ws.fresh_redis(0), ws.admin_db, ws.tmp)
        headers = {"Authorization": f"Bearer {fb.key}"}
        client = stack.enter_context(httpx.Client(base_url=fb.base_url, headers=headers))
        for name in profiles:
            _run_job(client, fb.conn, name)
        for number in range(args.jobs):
            order = list(profiles) if number % 2 == 0 else list(profiles)[::-1]
            for name in order:
                runs[name].append(_run_job(client, fb.conn, name))
        log("done")
    return report(args, runs)


def _median(runs: list[Run]) -> Run:
    return Run(
        statistics.median(r.makespan_s for r in runs),
        statistics.median(r.fast3_done_s for r in runs),
    )


def report(args: argparse.Namespace, runs: dict[str, list[Run]]) -> int:
    edges, layers = _median(runs["diamond_edges"]), _median(runs["diamond_layers"])
    if args.json:
        figures = {
            "jobs": args.jobs,
            "slow_s": args.slow,
            "step_s": args.step,
            "worker": {"pool": "prefork", "concurrency": WORKER_CONCURRENCY},
            "edges": asdict(edges),
            "layers": asdict(layers),
        }
        print(json.dumps(figures, indent=2))
        return 0
    print()
    print(
        f"diamond, slow branch {args.slow} s beside three {args.step} s steps, "
        f"{args.jobs} jobs of each, medians, prefork concurrency {WORKER_CONCURRENCY}"
    )
    for label, run in (("per-edge", edges), ("by layers", layers)):
        print(
            f"  {label:<9} makespan {run.makespan_s * 1000:.0f} ms, "
            f"fast3 done at {run.fast3_done_s * 1000:.0f} ms"
        )
    print(f"  makespan ratio layers/edges: {layers.makespan_s / edges.makespan_s:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
