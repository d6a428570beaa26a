"""What one persisted step costs PostgreSQL and Redis, and how many a second they carry.

    python -m bench.capacity [--jobs 2000] [--rounds 2] [--workers 1,2,4] [--grow 100000]
                             [--json]

The real stack (``flowbeat api`` and worker processes, as ``bench.stack`` starts them) runs
the chain bench's job, three no-op steps, against a PostgreSQL cluster and a Redis server of
this bench's own (``bench.servers``): ``pg_stat_statements`` preloaded, every other setting
at its default, and counters that nothing else on the machine adds to. Around the timed
section of each run it reads the WAL position and the WAL's statistics (its bytes, full page
images, flushes and commit records), ``pg_stat_database``'s commits, each statement's calls,
time and WAL, Redis's ``INFO commandstats``, and the CPU of every process (``bench.cpu``).
Divided by jobs and steps, these are the costs ``bench.capacity_model`` turns into steps a
second for a PostgreSQL of 2, 8 and 32 cores, and the next bottleneck beyond it.

Runs with 1, 2 and 4 worker processes (each with the harness's pool) check the model against
this machine: the order of worker counts turns round by round, each run is calibrated before
and after, and a disturbed run is marked. ``bench.pg_cost``'s in-process figure (the database's
CPU per job with nothing else on the cores) is measured on the same cluster beside them. The
sweeper's scans are timed on the last run's database as it stands and grown to ``--grow`` jobs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from bench.cpu import CpuMeter
from bench.harness import PIPELINE, PROFILE_YAML, STEPS_PER_JOB, log, on_sigterm
from bench.pg_cost import measure as pg_cost_measure
from bench.rounds import calibrate, disturbed, machine_pace, pace_line
from bench.servers import (
    MONITOR_ROLE,
    OwnPostgres,
    OwnRedis,
    fdatasync_per_s,
    own_postgres,
    own_redis,
)
from bench.stack import post_jobs, start_flowbeat, wait_final
from bench.sweep_cost import measure_sweeps

WARMUP_JOBS = 50
STATS_FLUSH_S = 11.0
"""A PostgreSQL 15 backend gone idle reports its counters to ``pg_stat_database`` within ten
seconds; nothing announces that it has, so the warm-up's are waited out before the start."""
TRIGGER_ROW = re.compile(r"\b(NEW|OLD)\.")
COMMIT_RECORDS = ("Transaction/COMMIT", "Transaction/COMMIT_PREPARED")
TRANSACTION_CONTROL = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE")


@dataclass
class Run:
    workers: int
    jobs: int
    wall_s: float
    cpu_s: dict[str, float]
    statements: int
    nested: int
    """Statements run inside PL/pgSQL: the event log's and the lifecycle's triggers."""
    transaction_control: int
    commits: int
    wal: dict[str, float]
    redis_calls: dict[str, int]
    top: list[dict[str, Any]] = field(default_factory=list)
    calibration: dict[str, dict[str, float]] = field(default_factory=dict)
    disturbed: bool = False
    sweeps: list[dict[str, float]] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return self.jobs * STEPS_PER_JOB

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.wall_s

    def per_step(self, value: float) -> float:
        return value / self.steps


def _snapshot(admin: psycopg.Connection[Any], database: str) -> dict[str, Any]:
    wal = admin.execute(
        "SELECT pg_current_wal_lsn()::text, wal_records, wal_fpi, wal_bytes::bigint, wal_write, "
        "wal_sync FROM pg_stat_wal"
    ).fetchone()
    commits = admin.execute(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (database,)
    ).fetchone()
    assert wal is not None and commits is not None
    keys = ("lsn", "records", "fpi", "bytes", "writes", "flushes")
    return {**dict(zip(keys, wal, strict=True)), "xact_commit": int(commits[0])}


def _wal(
    admin: psycopg.Connection[Any], before: dict[str, Any], after: dict[str, Any]
) -> dict[str, float]:
    """The WAL between the two positions: bytes, full-page-image bytes and commit records
    from the log itself, writes and flushes (fsyncs) from ``pg_stat_wal``."""
    rows = admin.execute(
        'SELECT "resource_manager/record_type", count, fpi_size '
        "FROM pg_get_wal_stats(%s::pg_lsn, %s::pg_lsn, true) WHERE count > 0",
        (before["lsn"], after["lsn"]),
    ).fetchall()
    diff = admin.execute(
        "SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)", (after["lsn"], before["lsn"])
    ).fetchone()
    assert diff is not None
    return {
        "bytes": float(diff[0]),
        "fpi_bytes": float(sum(row[2] for row in rows)),
        "commit_records": float(
            sum(row[1] for row in rows if row[0].startswith("Transaction/COMMIT"))
        ),
        "records": float(after["records"] - before["records"]),
        "writes": float(after["writes"] - before["writes"]),
        "flushes": float(after["flushes"] - before["flushes"]),
    }


def _statements(admin: psycopg.Connection[Any], database: str) -> list[dict[str, Any]]:
    rows = admin.execute(
        "SELECT s.query, s.calls, s.total_exec_time, s.rows, s.wal_bytes::bigint, "
        "r.rolname = %s, s.toplevel FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid "
        "JOIN pg_roles r ON r.oid = s.userid WHERE d.datname = %s ORDER BY s.total_exec_time DESC",
        (MONITOR_ROLE, database),
    ).fetchall()
    keys = ("query", "calls", "total_ms", "rows", "wal_bytes", "monitor", "toplevel")
    return [dict(zip(keys, row, strict=True)) for row in rows]


def _redis_calls(server: OwnRedis) -> dict[str, int]:
    stats = server.client().info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def _stop(processes: list[subprocess.Popen[bytes]], monitor: psycopg.Connection[Any]) -> None:
    """The API and the workers stopped, and their backends gone: a backend reports the last
    of its counters as it exits."""
    for proc in processes:
        proc.send_signal(signal.SIGTERM)
    for proc in processes:
        proc.wait(timeout=60)
    deadline = time.monotonic() + 30
    query = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND usename <> %s AND pid <> pg_backend_pid()"
    )
    while (row := monitor.execute(query, (MONITOR_ROLE,)).fetchone()) and row[0] > 1:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{row[0]} backends still connected")
        time.sleep(0.1)


def run_once(
    pg: OwnPostgres,
    server: OwnRedis,
    workers: int,
    jobs: int,
    clients: int,
    tmp: Path,
    sweep_sizes: list[int] | None = None,
) -> Run:
    """The stack's own connection (``fb.conn``) stays: it is the one backend left at the end.
    With ``sweep_sizes``, the sweeper's passes are timed on the run's database after it."""
    profiles = tmp / "profiles"
    server.client().flushdb()
    before_cal = calibrate()
    with ExitStack() as stack:
        fb = start_flowbeat(
            stack, {PIPELINE: PROFILE_YAML}, server.url, pg.admin_url, tmp, workers=workers
        )
        database = fb.env["FLOWBEAT_DATABASE_URL"].rsplit("/", 1)[1]
        errors: list[str] = []
        post_jobs(fb.base_url, fb.key, WARMUP_JOBS, clients, [], errors)
        wait_final(fb.conn, WARMUP_JOBS, time.monotonic() + 120, fb.dead)
        admin = stack.enter_context(psycopg.connect(pg.conninfo(), autocommit=True))
        monitor = stack.enter_context(
            psycopg.connect(pg.conninfo(database, MONITOR_ROLE), autocommit=True)
        )
        time.sleep(STATS_FLUSH_S)
        admin.execute("CHECKPOINT")
        admin.execute("SELECT pg_stat_statements_reset()")
        server.client().config_resetstat()
        before = _snapshot(admin, database)
        meter = CpuMeter({"api": [fb.api.pid], "workers": [w.pid for w in fb.workers]}, monitor)
        meter.roots["redis"] = [server.pid]
        meter.start()
        t0 = time.perf_counter()
        latencies: list[float] = []
        post_jobs(fb.base_url, fb.key, jobs, clients, latencies, errors)
        wait_final(monitor, WARMUP_JOBS + jobs, time.monotonic() + 900, fb.dead)
        wall = time.perf_counter() - t0
        lsn_after = _snapshot(admin, database)["lsn"]
        cpu = meter.stop()
        redis_calls = _redis_calls(server)
        if errors:
            raise RuntimeError(f"{len(errors)} POSTs failed, e.g. {errors[0]}")
        _stop([fb.api, *fb.workers], monitor)
        monitor.close()
        after = {**_snapshot(admin, database), "lsn": lsn_after}
        statements = _statements(admin, database)
        counts = _tally(statements)
        run = Run(
            workers=workers,
            jobs=len(latencies),
            wall_s=wall,
            cpu_s=cpu,
            statements=counts["sent"],
            nested=counts["nested"],
            transaction_control=counts["control"],
            commits=after["xact_commit"] - before["xact_commit"] - counts["monitor"],
            wal=_wal(admin, before, after),
            redis_calls=redis_calls,
            top=[s for s in statements if not s["monitor"]][:8],
            calibration={"before": before_cal},
        )
        if sweep_sizes is not None:
            run.sweeps = measure_sweeps(fb.env["FLOWBEAT_DATABASE_URL"], profiles, sweep_sizes)
    run.calibration["after"] = calibrate()
    return run


def _tally(statements: list[dict[str, Any]]) -> dict[str, int]:
    """Calls of the statements flowbeat sent, of transaction control among them, of those its
    triggers ran, and of the bench's own (each one a transaction of its own)."""
    counts = dict.fromkeys(("sent", "control", "nested", "monitor"), 0)
    for s in statements:
        kind = "monitor" if s["monitor"] else "nested" if not _sent(s) else "sent"
        if kind == "sent" and _control(s["query"]):
            kind = "control"
        counts[kind] += int(s["calls"])
    return counts


def _sent(statement: dict[str, Any]) -> bool:
    """Sent by flowbeat's processes, rather than run by the bench or by a trigger. A deferred
    trigger runs at commit, outside any statement, so ``pg_stat_statements`` counts what it
    runs as top-level: its statements are known by the row they read, ``NEW`` or ``OLD``."""
    nested = not statement["toplevel"] or TRIGGER_ROW.search(statement["query"])
    return not nested and not statement["monitor"]


def _control(query: str) -> bool:
    return query.lstrip().upper().startswith(TRANSACTION_CONTROL)


def _rounds(args: argparse.Namespace, fdatasyncs: list[float]) -> tuple[list[Run], list[float]]:
    """The worker counts in turn, reversed each round; ``bench.pg_cost``'s in-process cost
    once a round on the same cluster; the sweeper's passes after the last run."""
    from bench.pg_cost import VARIANTS

    runs: list[Run] = []
    isolated: list[float] = []
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="flowbeat-capacity-")))
        pg = stack.enter_context(own_postgres())
        fdatasyncs.append(fdatasync_per_s(pg))
        server = stack.enter_context(own_redis(tmp))
        (tmp / "pg-cost").mkdir()
        (tmp / "pg-cost" / f"{PIPELINE}.yaml").write_text(PROFILE_YAML)
        for number in range(args.rounds):
            order = args.workers if number % 2 == 0 else args.workers[::-1]
            for index, workers in enumerate(order):
                last = number == args.rounds - 1 and index == len(order) - 1
                run_dir = tmp / f"run-{number}-{workers}"
                run_dir.mkdir()
                sizes = args.grow if last else None
                runs.append(run_once(pg, server, workers, args.jobs, args.clients, run_dir, sizes))
                log(f"round {number + 1}, {workers} worker(s): {runs[-1].steps_per_s:.0f} steps/s")
            cost = pg_cost_measure(pg.admin_url, tmp / "pg-cost", VARIANTS[0], args.jobs)
            isolated.append(cost.total_ms)
    return runs, isolated


def main(argv: list[str] | None = None) -> int:
    from bench import capacity_model as model

    parser = argparse.ArgumentParser(
        prog="python -m bench.capacity",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--jobs", type=int, default=2000, help="timed jobs a run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", type=int, default=4, help="concurrent HTTP client threads")
    parser.add_argument("--workers", type=_counts, default=[1, 2, 4], help="e.g. 1,2,4")
    parser.add_argument(
        "--grow", type=_counts, default=[100_000, 1_000_000], help="jobs, e.g. 1e5,1e6"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, on_sigterm)
    fdatasyncs: list[float] = []
    runs, isolated = _rounds(args, fdatasyncs)
    loops = [r.calibration[m]["loop_ms"] for r in runs for m in ("before", "after")]
    for run in runs:
        run.disturbed = disturbed(run.calibration["before"], run.calibration["after"], min(loops))
    clean = [r for r in runs if not r.disturbed] or runs
    cost = model.costs(clean, isolated)
    pace = machine_pace(loops)
    figures: dict[str, Any] = {
        "costs": cost,
        "table": model.postgres_table(cost),
        "next": model.next_limits(cost),
        "redis_commands": model.redis_commands(clean),
        "sweeps": next(r.sweeps for r in reversed(runs) if r.sweeps),
        "machine_cores": os.cpu_count() or 1,
        "fdatasync_per_s": fdatasyncs[0],
        "check": model.check(clean, os.cpu_count() or 1, fdatasyncs[0]),
        "pace": pace,
        "isolated_pg_ms_per_job": isolated,
        "runs": [{**asdict(r), "steps_per_s": r.steps_per_s} for r in runs],
    }
    if args.json:
        print(json.dumps(figures, indent=2, default=str))
        return 0
    for line in [*_run_lines(runs), *_top_lines(runs[-1]), *model.report(figures)]:
        print(line)
    print(pace_line(pace))
    return 0


def _counts(text: str) -> list[int]:
    return [int(float(part)) for part in text.split(",") if part.strip()]


def _run_lines(runs: list[Run]) -> list[str]:
    lines = ["", "runs (jobs of three no-op steps; CPU ms a step):"]
    for r in runs:
        before, after = r.calibration["before"], r.calibration["after"]
        cpu = ", ".join(f"{part} {1000 * s / r.steps:.3f}" for part, s in r.cpu_s.items())
        lines.append(
            f"  {r.workers} worker(s): {r.jobs} jobs, {r.steps_per_s:.0f} steps/s; {cpu} "
            f"(loop {before['loop_ms']:.0f}/{after['loop_ms']:.0f} ms, background "
            f"{before['background_cores']:.2f}/{after['background_cores']:.2f} cores, load "
            f"{before['load_1m']:.2f}/{after['load_1m']:.2f}){' DISTURBED' if r.disturbed else ''}"
        )
    return lines


def _top_lines(run: Run) -> list[str]:
    lines = [f"top statements by time, last run ({run.workers} worker(s)), per step:"]
    for s in run.top:
        query = " ".join(s["query"].split())
        where = "" if _sent(s) else "(by a trigger) "
        lines.append(
            f"  {s['calls'] / run.steps:5.2f} calls {s['total_ms'] / run.steps:6.3f} ms "
            f"{s['wal_bytes'] / run.steps:7.0f} WAL bytes  {where}{query[:100]}"
        )
    return lines


if __name__ == "__main__":
    sys.exit(main())
