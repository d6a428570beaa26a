"""Many live event streams on one API process while jobs run: is every event delivered, and when?

    python -m bench.event_streams [--jobs 100] [--per-job 2] [--json]

One flowbeat stack (the API under uvicorn, one worker with prefork ``--concurrency 2``). The
client POSTs ``--jobs`` jobs of a profile with a short sleep and a 20-item fan-out, and as each
job id comes back opens ``--per-job`` NDJSON streams on ``/v1/jobs/{id}/events`` (200 streams for
the defaults), so most streams are open while the jobs run and their first events are replays.
When every stream has closed (each job final), each stream's events are compared with the
job's log in PostgreSQL: missing, duplicated or out-of-order events are counted. Delivery lag is
the time from an event's commit (its ``at``) to its arrival at the client, for live events only.
The API's resident memory is read before and after, and the CPU calibration of
``bench.chain_throughput`` is printed with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import sys
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bench.harness import WORKER_CONCURRENCY, log, on_sigterm, pct, workspace
from bench.rounds import calibrate
from bench.stack import start_flowbeat

PIPELINE = "bench_events"
PROFILE_YAML = f"""\
name: {PIPELINE}
params:
  items: {{type: array, default: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17,
    18, 19, 20]}}
steps:
  - {{id: a, action: noop}}
  - {{id: b, action: sleep, depends_on: [a], with: {{seconds: 0.2}}}}
  - id: c
    action: noop
    depends_on: [b]
    for_each: {{items: "${{{{ params.items }}}}", max_parallel: 4}}
    with: {{item: "${{{{ item }}}}"}}
"""


@dataclass
class Figures:
    jobs: int
    streams: int
    events_expected: int
    events_delivered: int
    missing: int
    duplicated: int
    out_of_order: int
    lag_p50_ms: float
    lag_p99_ms: float
    wall_s: float
    api_rss_mb_before: float
    api_rss_mb_after: float


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _follow(
    http: httpx.AsyncClient, base: str, key: str, job_id: str, lags: list[float]
) -> list[tuple[int, str]]:
    got: list[tuple[int, str]] = []
    headers = {"Authorization": f"Bearer {key}", "Accept": "application/x-ndjson"}
    async with http.stream("GET", f"{base}/v1/jobs/{job_id}/events", headers=headers) as answer:
        answer.raise_for_status()
        opened = time.time()
        async for line in answer.aiter_lines():
            if not line:
                continue
            event = json.loads(line)
            got.append((event["seq"], event["kind"]))
            at = datetime.fromisoformat(event["at"]).timestamp()
            if at >= opened:
                lags.append(time.time() - at)
    return got


async def _run(base: str, key: str, jobs: int, per_job: int) -> tuple[dict[str, Any], float]:
    lags: list[float] = []
    limits = httpx.Limits(max_connections=jobs * per_job + 20, max_keepalive_connections=20)
    async with httpx.AsyncClient(timeout=300, limits=limits) as http:
        started = time.monotonic()
        streams: dict[str, list[asyncio.Task[list[tuple[int, str]]]]] = {}
        for _ in range(jobs):
            answer = await http.post(
                f"{base}/v1/jobs",
                json={"pipeline": PIPELINE},
                headers={"Authorization": f"Bearer {key}"},
            )
            answer.raise_for_status()
            job_id = answer.json()["job"]["id"]
            streams[job_id] = [
                asyncio.create_task(_follow(http, base, key, job_id, lags)) for _ in range(per_job)
            ]
        results = {job_id: await asyncio.gather(*tasks) for job_id, tasks in streams.items()}
        wall = time.monotonic() - started
    return {"results": results, "lags": lags}, wall


LOGGED = """
    SELECT seq, kind FROM job_events WHERE job_id = %(job)s
    UNION ALL
    SELECT e.seq - jsonb_array_length(e.more) + m.place - 1, m.event ->> 'kind'
      FROM job_events AS e, jsonb_array_elements(e.more) WITH ORDINALITY AS m(event, place)
     WHERE e.job_id = %(job)s
     ORDER BY 1
"""
"""Every event of a job, those a row holds before its last (``more``, ADR 20) included."""


def _compare(conn: Any, results: dict[str, list[list[tuple[int, str]]]]) -> dict[str, int]:
    expected = delivered = missing = duplicated = disorder = 0
    for job_id, streams in results.items():
        log_rows = conn.execute(LOGGED, {"job": job_id}).fetchall()
        truth = [(seq, kind) for seq, kind in log_rows]
        for got in streams:
            expected += len(truth)
            delivered += len(got)
            missing += len(set(truth) - set(got))
            duplicated += len(got) - len(set(got))
            disorder += int([seq for seq, _ in got] != sorted(seq for seq, _ in got))
    return {
        "events_expected": expected,
        "events_delivered": delivered,
        "missing": missing,
        "duplicated": duplicated,
        "out_of_order": disorder,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.event_streams",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--per-job", type=int, default=2, help="streams opened on each job")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, on_sigterm)
    before_cal = calibrate()
    with ExitStack() as stack:
        ws = workspace(stack, "events")
        fb = start_flowbeat(stack, {PIPELINE: PROFILE_YAML}, ws.fresh_redis(1), ws.admin_db, ws.tmp)
        rss_before = _rss_mb(fb.api.pid)
        log(f"{args.jobs} jobs, {args.jobs * args.per_job} streams")
        out, wall = asyncio.run(_run(fb.base_url, fb.key, args.jobs, args.per_job))
        rss_after = _rss_mb(fb.api.pid)
        counts = _compare(fb.conn, out["results"])
    lags_ms = [lag * 1000 for lag in out["lags"]]
    figures = Figures(
        jobs=args.jobs,
        streams=args.jobs * args.per_job,
        **counts,
        lag_p50_ms=statistics.median(lags_ms) if lags_ms else 0.0,
        lag_p99_ms=pct(lags_ms, 0.99) if lags_ms else 0.0,
        wall_s=wall,
        api_rss_mb_before=rss_before,
        api_rss_mb_after=rss_after,
    )
    calibration = {"before": before_cal, "after": calibrate()}
    if args.json:
        print(json.dumps({**asdict(figures), "calibration": calibration}, indent=2))
    else:
        f = figures
        print()
        print(
            f"event streams: {f.streams} NDJSON streams on one API process, {f.jobs} jobs "
            f"(prefork concurrency {WORKER_CONCURRENCY})"
        )
        print(
            f"  events: {f.events_delivered}/{f.events_expected} delivered, missing {f.missing}, "
            f"duplicated {f.duplicated}, out of order {f.out_of_order}"
        )
        print(
            f"  live delivery lag p50 {f.lag_p50_ms:.0f} ms, p99 {f.lag_p99_ms:.0f} ms; "
            f"wall {f.wall_s:.1f} s; API RSS {f.api_rss_mb_before:.0f} -> "
            f"{f.api_rss_mb_after:.0f} MB"
        )
        print(
            f"  calibration: loop {before_cal['loop_ms']:.0f} ms before, "
            f"{calibration['after']['loop_ms']:.0f} ms after; load "
            f"{before_cal['load_1m']:.2f} before, {calibration['after']['load_1m']:.2f} after"
        )
    failed = figures.missing or figures.duplicated or figures.out_of_order
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
