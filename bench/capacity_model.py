"""The capacity model: the costs ``bench.capacity`` measured per step, turned into the steps a
second a PostgreSQL of a given size carries, and the next limits beyond it.

A model, not a measurement: each ceiling is a measured cost per step set against a resource
whose size is an assumption, named here with its reason. The check against this machine is
the runs themselves.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

CORES = (2, 8, 32)
PG_USABLE = 0.7
"""The share of PostgreSQL's cores its backends may use: the rest is left to autovacuum, the
checkpointer and the WAL writer, and as headroom, since a queue in front of busier cores adds
latency to every statement."""
WAL_BYTES_S = 500e6
"""WAL bandwidth: half of the 1 GB/s that a data-center NVMe drive sustains in sequential
writes, the other half left to the checkpointer's data pages on the same drive."""
FLUSH_S = 100e-6
"""One WAL flush (fdatasync) on a data-center NVMe drive with power-loss protection: 10,000
flushes a second from one WAL writer. A drive without that protection flushes in about a
millisecond, a tenth of the rate."""
SINGLE_CORE_USABLE = 0.8
"""The share of its one core that Redis (single-threaded) or one API process may use."""


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def per_step(runs: list[Any], value: Callable[[Any], float]) -> float:
    return median([value(run) / run.steps for run in runs])


def costs(runs: list[Any], isolated_ms_per_job: list[float]) -> dict[str, float]:
    """Medians over ``runs`` of each cost per persisted step (a job's intake counted in its
    three steps)."""
    return {
        "statements": per_step(runs, lambda r: r.statements),
        "transaction_control": per_step(runs, lambda r: r.transaction_control),
        "nested": per_step(runs, lambda r: r.nested),
        "commits": per_step(runs, lambda r: r.commits),
        "commit_records": per_step(runs, lambda r: r.wal["commit_records"]),
        "wal_flushes": per_step(runs, lambda r: r.wal["flushes"]),
        "wal_bytes": per_step(runs, lambda r: r.wal["bytes"]),
        "wal_fpi_bytes": per_step(runs, lambda r: r.wal["fpi_bytes"]),
        "pg_cpu_ms": per_step(runs, lambda r: 1000 * r.cpu_s["postgres"]),
        "pg_cpu_ms_isolated": median(isolated_ms_per_job) / 3,
        "redis_calls": per_step(runs, lambda r: sum(r.redis_calls.values())),
        "redis_cpu_ms": per_step(runs, lambda r: 1000 * r.cpu_s["redis"]),
        "api_cpu_ms": per_step(runs, lambda r: 1000 * r.cpu_s["api"]),
        "workers_cpu_ms": per_step(runs, lambda r: 1000 * r.cpu_s["workers"]),
        "client_cpu_ms": per_step(runs, lambda r: 1000 * r.cpu_s["client"]),
    }


def postgres_table(cost: dict[str, float]) -> list[dict[str, float]]:
    """Steps a second for each size: CPU-bound, WAL-bandwidth-bound, flush-bound (one flush
    a commit record, the floor; group commit lifts it), and the least of them."""
    wal = WAL_BYTES_S / cost["wal_bytes"]
    flushes = 1 / FLUSH_S / cost["commit_records"]
    rows = []
    for cores in CORES:
        cpu = cores * PG_USABLE / (cost["pg_cpu_ms"] / 1000)
        rows.append({"cores": cores, "cpu": cpu, "wal": wal, "flush": flushes})
        rows[-1]["carries"] = min(cpu, wal, flushes)
    return rows


def next_limits(cost: dict[str, float]) -> dict[str, float]:
    """Redis is one thread: its ceiling is one core's. The API and the workers scale out by
    processes: theirs is a cost in cores per 1,000 steps a second."""
    return {
        "redis_steps_s": SINGLE_CORE_USABLE / (cost["redis_cpu_ms"] / 1000),
        "redis_ops_s_at_ceiling": SINGLE_CORE_USABLE
        / (cost["redis_cpu_ms"] / 1000)
        * cost["redis_calls"],
        "api_steps_s_per_process": SINGLE_CORE_USABLE / (cost["api_cpu_ms"] / 1000),
        "api_cores_per_1000": cost["api_cpu_ms"],
        "workers_cores_per_1000": cost["workers_cpu_ms"],
        "pg_cores_per_1000": cost["pg_cpu_ms"],
    }


def check(runs: list[Any], cores: int, fdatasync_per_s: float) -> list[dict[str, float]]:
    """Each worker count's measured steps a second beside three predictions for this machine:
    PostgreSQL's ceiling were it alone on every core; the whole stack's, every part's CPU per
    step (the 1-worker runs' medians) sharing ``cores``; and the WAL flushes' (this drive's
    fdatasyncs a second, each carrying as many commits as that worker count's runs grouped)."""
    one = [r for r in runs if r.workers == min(r.workers for r in runs)]
    total_ms = per_step(one, lambda r: 1000 * sum(r.cpu_s.values()))
    pg_ms = per_step(one, lambda r: 1000 * r.cpu_s["postgres"])
    rows: list[dict[str, float]] = []
    for workers in sorted({r.workers for r in runs}):
        mine = [r for r in runs if r.workers == workers]
        rows.append(
            {
                "workers": workers,
                "measured": median([r.steps_per_s for r in mine]),
                "busy_cores": median([sum(r.cpu_s.values()) / r.wall_s for r in mine]),
                "pg_cores": median([r.cpu_s["postgres"] / r.wall_s for r in mine]),
                "pg_alone": cores / (pg_ms / 1000),
                "stack": cores / (total_ms / 1000),
                "commits_per_flush": median(
                    [r.wal["commit_records"] / max(r.wal["flushes"], 1) for r in mine]
                ),
            }
        )
    records = per_step(runs, lambda r: r.wal["commit_records"])
    for row in rows:
        row["flush_bound"] = fdatasync_per_s * row["commits_per_flush"] / records
    return rows


def redis_commands(runs: list[Any], top: int = 8) -> list[tuple[str, float]]:
    """The commands Redis ran most, calls a step (medians over ``runs``)."""
    names = {name for r in runs for name in r.redis_calls}
    calls = {name: median([r.redis_calls.get(name, 0) / r.steps for r in runs]) for name in names}
    return sorted(calls.items(), key=lambda item: -item[1])[:top]


def sweep_lines(sweeps: list[dict[str, float]]) -> list[str]:
    return [f"    {s['jobs']:,.0f} jobs: {s['pass_ms']:.1f} ms a pass" for s in sweeps]


def report(figures: dict[str, Any]) -> list[str]:
    c = figures["costs"]
    lines = [
        "",
        "cost of one persisted step in PostgreSQL (medians over undisturbed runs; a job is "
        "three steps, its intake included):",
        f"  statements sent {c['statements']:.2f} (+ {c['transaction_control']:.2f} "
        f"BEGIN/COMMIT; {c['nested']:.2f} more run by triggers), "
        f"commits {c['commits']:.2f} ({c['commit_records']:.2f} write WAL), "
        f"WAL flushes {c['wal_flushes']:.3f}",
        f"  WAL {c['wal_bytes']:,.0f} bytes a step, {3 * c['wal_bytes']:,.0f} a job "
        f"(full page images {c['wal_fpi_bytes']:,.0f} a step, the run started at a checkpoint)",
        f"  PostgreSQL CPU {c['pg_cpu_ms']:.3f} ms a step in the stack, "
        f"{c['pg_cpu_ms_isolated']:.3f} ms alone (bench.pg_cost's path)",
        f"  Redis {c['redis_calls']:.1f} commands, {c['redis_cpu_ms']:.3f} ms CPU a step; API "
        f"{c['api_cpu_ms']:.3f} ms, workers {c['workers_cpu_ms']:.3f} ms, load generator "
        f"{c['client_cpu_ms']:.3f} ms a step",
        "",
        f"steps/s a PostgreSQL carries (CPU at {PG_USABLE:.0%} of its cores; WAL at "
        f"{WAL_BYTES_S / 1e6:.0f} MB/s; one {FLUSH_S * 1e6:.0f} us flush a commit):",
    ]
    for row in figures["table"]:
        lines.append(
            f"  {row['cores']:>2} cores: CPU {row['cpu']:>9,.0f}, WAL {row['wal']:>9,.0f}, "
            f"flush {row['flush']:>9,.0f} -> {row['carries']:,.0f}"
        )
    n = figures["next"]
    commands = ", ".join(f"{name} {calls:.2f}" for name, calls in figures["redis_commands"])
    lines += [
        "next limits:",
        f"  Redis, one thread: {n['redis_steps_s']:,.0f} steps/s "
        f"({n['redis_ops_s_at_ceiling']:,.0f} commands/s); commands a step: {commands}",
        f"  API: {n['api_steps_s_per_process']:,.0f} steps/s a process; cores per 1,000 "
        f"steps/s: API {n['api_cores_per_1000']:.2f}, workers {n['workers_cores_per_1000']:.2f}, "
        f"PostgreSQL {n['pg_cores_per_1000']:.2f}",
        "  sweeper pass (lost-message scans and retention prune):",
        *sweep_lines(figures["sweeps"]),
        f"check on this machine ({figures['machine_cores']} cores, "
        f"{figures['fdatasync_per_s']:,.0f} fdatasyncs/s):",
    ]
    for row in figures["check"]:
        lines.append(
            f"  {row['workers']} worker(s): measured {row['measured']:,.0f} steps/s, "
            f"{row['busy_cores']:.2f} cores busy ({row['pg_cores']:.2f} PostgreSQL); predicted: "
            f"PostgreSQL alone {row['pg_alone']:,.0f}, whole stack {row['stack']:,.0f}, WAL "
            f"flushes {row['flush_bound']:,.0f} ({row['commits_per_flush']:.2f} commits a flush)"
        )
    return lines
