"""What PostgreSQL does for one persisted step, counted by statement, row, index entry and WAL
byte: the counts that do not drift with the machine's speed.

    python -m bench.step_cost [--jobs 300] [--items 1000] [--json] [--profile-worker [DIR]]
                              [--base REV] [--rounds N]

A lighter companion of ``bench.capacity``: one cluster of its own (``bench.servers``, with
``pg_stat_statements.track = all`` so statements run inside triggers and functions are counted
too), the real stack (``flowbeat api`` and one worker), and two profiles measured one after the
other on fresh databases: the chain bench's job (three no-op steps) posted ``--jobs`` times,
and one job fanning out over ``--items`` items. Around each it reads ``pg_stat_statements``,
``pg_stat_database``'s commits, ``pg_stat_user_tables``' rows, the WAL between the two
positions (``pg_walinspect``: bytes, full-page images, bytes by record type and by table, and
the B-tree insertions by index, which are the index entries written) and the CPU of the
database's backends. The API and the worker are stopped before the counters are read, since a
backend reports its last counters as it exits.

``--profile-worker`` records the worker (its main process and its pool) with py-spy during the
chain's timed part only (into ``DIR/worker.txt`` if given, py-spy's raw format), a sample being
a moment a process held the GIL (``harness.py_spy`` says why), and prints its samples by part:
psycopg, sqlalchemy, redis, kombu, billiard, celery, flowbeat (``service/``, ``tasks/``), the
standard library, other (``bench.profile_summary.Parts`` says how a sample is attributed).
py-spy slows the worker: the counts of such a run are still exact, its CPU figures are not
comparable with a run without it.

``--base REV`` measures the same profiles on the code of git revision REV too, checked out in a
temporary git worktree (``bench.checkout``) with its database migrated by that revision's own
migrations, and ``--rounds N`` repeats both sides, their order turned each round
(``bench.rounds.in_turn``): before and after on the same cluster in the same minutes. The head's
last run is reported in full, then every run's counts a step side by side with each side's
median.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import psycopg
from redis import Redis as OwnRedisClient

from bench.capacity import STATS_FLUSH_S, TRIGGER_ROW, _control, _statements, _stop
from bench.checkout import Checkout, worktree
from bench.cpu import CpuMeter
from bench.fanout import PIPELINE as FANOUT
from bench.fanout import profile_yaml
from bench.harness import PIPELINE as CHAIN
from bench.harness import PROFILE_YAML, STEPS_PER_JOB, log, on_sigterm, py_spy
from bench.profile_summary import Parts, parts, parts_table
from bench.rounds import in_turn
from bench.servers import MONITOR_ROLE, OwnPostgres, own_postgres, own_redis
from bench.stack import FlowbeatStack, post_jobs, start_flowbeat, wait_final

WARMUP_JOBS = 20
FANOUT_LANES = 50
CLIENTS = 4
FIRST_BLOCKS_RELATION = "substring(block_ref from 'rel \\d+/\\d+/(\\d+)')::oid"
"""The relfilenode of the first block a WAL record names (``pg_get_wal_records_info``)."""
INDEX_INSERTS = f"""
SELECT {FIRST_BLOCKS_RELATION}, count(*)
  FROM pg_get_wal_records_info(%s::pg_lsn, %s::pg_lsn)
 WHERE resource_manager = 'Btree' AND record_type LIKE 'INSERT%%'
 GROUP BY 1
"""
"""A B-tree insertion is one WAL record on the leaf (or, on a split, the upper page) it lands
on: counting them by relation counts the index entries each index was given."""
WAL_BY_RELATION = f"""
SELECT {FIRST_BLOCKS_RELATION}, sum(record_length)
  FROM pg_get_wal_records_info(%s::pg_lsn, %s::pg_lsn)
 GROUP BY 1
"""
"""A record is charged to the relation of its first block; a commit, which names none, to
none."""
OWNING_TABLE = """
SELECT c.relfilenode, coalesce(owner.relname, t.relname)
  FROM pg_class AS c
  LEFT JOIN pg_index AS i ON i.indexrelid = c.oid
  JOIN pg_class AS t ON t.oid = coalesce(i.indrelid, c.oid)
  LEFT JOIN pg_class AS owner ON owner.reltoastrelid = t.oid
 WHERE c.relfilenode = ANY(%s)
"""
"""An index's bytes are its table's, and a TOAST table's (and its index's) are the table it
holds values for."""
TABLE_ROWS = (
    "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables"
)


@dataclass
class Profile:
    name: str
    jobs: int
    steps: int
    statements: dict[str, int]
    commits: int
    wal: dict[str, float]
    rows: dict[str, dict[str, int]]
    index_entries: dict[str, int]
    wal_records: dict[str, float]
    """WAL bytes by record type (resource manager/record type), full-page images included."""
    wal_tables: dict[str, float]
    """WAL bytes by table, its indexes and TOAST included (``WAL_BY_RELATION``)."""
    postgres_cpu_s: float
    top: list[dict[str, Any]] = field(default_factory=list)
    worker: Parts | None = None
    """The worker's py-spy samples by part (``--profile-worker``, the chain only)."""
    side: str = "head"
    """``head``, or ``base`` for a run on ``--base``'s code."""


def _table_rows(conn: psycopg.Connection[Any]) -> dict[str, tuple[int, ...]]:
    return {row[0]: tuple(row[1:]) for row in conn.execute(TABLE_ROWS).fetchall()}


def _row_deltas(
    before: dict[str, tuple[int, ...]], after: dict[str, tuple[int, ...]]
) -> dict[str, dict[str, int]]:
    keys = ("inserted", "updated", "hot", "deleted")
    deltas = {}
    for table, counts in after.items():
        old = before.get(table, (0, 0, 0, 0))
        change = {k: new - was for k, new, was in zip(keys, counts, old, strict=True)}
        if any(change.values()):
            deltas[table] = change
    return deltas


def _commits(admin: psycopg.Connection[Any], database: str) -> int:
    row = admin.execute(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (database,)
    ).fetchone()
    assert row is not None
    return int(row[0])


def _lsn(admin: psycopg.Connection[Any]) -> str:
    row = admin.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def _wal(admin: psycopg.Connection[Any], start: str, end: str) -> dict[str, float]:
    row = admin.execute(
        "SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn), "
        "(SELECT coalesce(sum(fpi_size), 0) FROM pg_get_wal_stats(%s::pg_lsn, %s::pg_lsn)), "
        "(SELECT coalesce(sum(count), 0) FROM pg_get_wal_stats(%s::pg_lsn, %s::pg_lsn) "
        "  WHERE \"resource_manager/record_type\" LIKE 'Transaction/COMMIT%%')",
        (end, start, start, end, start, end),
    ).fetchone()
    assert row is not None
    return {"bytes": float(row[0]), "fpi_bytes": float(row[1]), "commit_records": float(row[2])}


def _wal_records(admin: psycopg.Connection[Any], start: str, end: str) -> dict[str, float]:
    rows = admin.execute(
        'SELECT "resource_manager/record_type", record_size + fpi_size '
        "FROM pg_get_wal_stats(%s::pg_lsn, %s::pg_lsn, true) WHERE count > 0 ORDER BY 2 DESC",
        (start, end),
    ).fetchall()
    return {str(kind): float(size) for kind, size in rows}


def _index_entries(
    admin: psycopg.Connection[Any], tables: psycopg.Connection[Any], start: str, end: str
) -> dict[str, int]:
    """The WAL is read in the cluster's own database, the relations' names in the run's."""
    counts = dict(admin.execute(INDEX_INSERTS, (start, end)).fetchall())
    names = dict(
        tables.execute(
            "SELECT relfilenode, relname FROM pg_class WHERE relfilenode = ANY(%s)", (list(counts),)
        ).fetchall()
    )
    return {names.get(node, str(node)): int(n) for node, n in sorted(counts.items())}


def _wal_tables(
    admin: psycopg.Connection[Any], tables: psycopg.Connection[Any], start: str, end: str
) -> dict[str, float]:
    sizes = admin.execute(WAL_BY_RELATION, (start, end)).fetchall()
    known = [node for node, _ in sizes if node is not None]
    names = dict(tables.execute(OWNING_TABLE, (known,)).fetchall())
    elsewhere = "(not in the run's database)"
    by_table: dict[str, float] = {}
    for node, size in sizes:
        name = "(no relation: commits)" if node is None else names.get(node, elsewhere)
        by_table[name] = by_table.get(name, 0.0) + float(size)
    return dict(sorted(by_table.items(), key=lambda kv: -kv[1]))


def _tally(statements: list[dict[str, Any]]) -> dict[str, int]:
    """Sent by flowbeat (transaction control apart), run by triggers (nested, or a deferred
    trigger's own statements, known by the row they read), and the bench's own polling."""
    counts = dict.fromkeys(("sent", "control", "by_triggers", "monitor"), 0)
    for s in statements:
        if s["monitor"]:
            kind = "monitor"
        elif not s["toplevel"] or TRIGGER_ROW.search(s["query"]):
            kind = "by_triggers"
        else:
            kind = "control" if _control(s["query"]) else "sent"
        counts[kind] += int(s["calls"])
    return counts


def _fan_out(fb: FlowbeatStack, items: int, deadline: float) -> None:
    headers = {"Authorization": f"Bearer {fb.key}"}
    with httpx.Client(base_url=fb.base_url, headers=headers, timeout=60) as client:
        body = {"pipeline": FANOUT, "params": {"items": list(range(items))}}
        response = client.post("/v1/jobs", json=body)
        if response.status_code != 202:
            raise RuntimeError(f"POST /v1/jobs: {response.status_code} {response.text[:300]}")
    wait_final(fb.conn, 1 + _done(fb.conn), deadline, fb.dead)


def _done(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT count(*) FROM jobs WHERE status IN ('succeeded', 'failed', 'cancelled')"
    ).fetchone()
    assert row is not None
    return int(row[0])


def measure(
    pg: OwnPostgres,
    redis_url: str,
    tmp: Path,
    name: str,
    size: int,
    spy_dir: Path | None = None,
    checkout: Checkout | None = None,
) -> Profile:
    """One profile on a fresh database: warmed up, counters reset, the timed work (the worker
    recorded by py-spy into ``spy_dir`` if given), the stack stopped, the counters read. With
    ``checkout``, on that revision's code and migrations."""
    with ExitStack() as stack:
        OwnRedisClient.from_url(redis_url).flushdb()
        profiles = {CHAIN: PROFILE_YAML, FANOUT: profile_yaml(FANOUT_LANES)}
        fb = start_flowbeat(stack, profiles, redis_url, pg.admin_url, tmp, checkout=checkout)
        database = fb.env["FLOWBEAT_DATABASE_URL"].rsplit("/", 1)[1]
        post_jobs(fb.base_url, fb.key, WARMUP_JOBS, CLIENTS, [], [])
        wait_final(fb.conn, WARMUP_JOBS, time.monotonic() + 120, fb.dead)
        admin = stack.enter_context(psycopg.connect(pg.conninfo(), autocommit=True))
        tables = stack.enter_context(
            psycopg.connect(pg.conninfo(database, MONITOR_ROLE), autocommit=True)
        )
        monitor = stack.enter_context(
            psycopg.connect(pg.conninfo(database, MONITOR_ROLE), autocommit=True)
        )
        time.sleep(STATS_FLUSH_S)
        admin.execute("CHECKPOINT")
        admin.execute("SELECT pg_stat_statements_reset()")
        rows_before, commits_before = _table_rows(tables), _commits(admin, database)
        start = _lsn(admin)
        meter = CpuMeter({}, monitor)
        meter.start()
        deadline = time.monotonic() + 900
        if spy_dir:
            (spy_dir / "worker.txt").unlink(missing_ok=True)
        with py_spy(spy_dir, fb.worker.pid, "worker", gil=True):
            if name == "chain":
                errors: list[str] = []
                post_jobs(fb.base_url, fb.key, size, CLIENTS, [], errors)
                if errors:
                    raise RuntimeError(f"{len(errors)} POSTs failed, e.g. {errors[0]}")
                wait_final(monitor, WARMUP_JOBS + size, deadline, fb.dead)
            else:
                _fan_out(fb, size, deadline)
        end = _lsn(admin)
        cpu = meter.stop()["postgres"]
        _stop([fb.api, *fb.workers], monitor)
        monitor.close()
        statements = _statements(admin, database)
        counts = _tally(statements)
        entries = _index_entries(admin, tables, start, end)
        return Profile(
            name=name,
            jobs=size if name == "chain" else 1,
            steps=size * STEPS_PER_JOB if name == "chain" else size,
            statements=counts,
            commits=_commits(admin, database) - commits_before - counts["monitor"],
            wal=_wal(admin, start, end),
            rows=_row_deltas(rows_before, _table_rows(tables)),
            index_entries=entries,
            wal_records=_wal_records(admin, start, end),
            wal_tables=_wal_tables(admin, tables, start, end),
            postgres_cpu_s=cpu,
            top=[s for s in statements if not s["monitor"]][:10],
            worker=_worker_parts(spy_dir),
            side="head" if checkout is None else "base",
        )


def _worker_parts(spy_dir: Path | None) -> Parts | None:
    recorded = spy_dir / "worker.txt" if spy_dir else None
    return parts(recorded) if recorded and recorded.exists() else None


def report(profile: Profile) -> list[str]:
    steps, jobs = profile.steps, profile.jobs

    def line(label: str, value: float) -> str:
        return f"  {label:<34} {value / steps:10.2f} {value / jobs:12.1f}"

    counts = profile.statements
    lines = [
        "",
        f"{profile.name}: {jobs} job(s), {steps} persisted steps",
        f"  {'':<34} {'a step':>10} {'a job':>12}",
        line("statements sent", counts["sent"]),
        line("  + BEGIN/COMMIT sent", counts["control"]),
        line("statements run by triggers", counts["by_triggers"]),
        line("commits", profile.commits),
        line("WAL bytes", profile.wal["bytes"]),
        line("  of which full-page images", profile.wal["fpi_bytes"]),
        line("index entries written", sum(profile.index_entries.values())),
        line("PostgreSQL CPU (ms)", 1000 * profile.postgres_cpu_s),
        "  rows (inserted/updated [HOT]/deleted) a step:",
    ]
    for table, r in sorted(profile.rows.items()):
        lines.append(
            f"    {table:<24} {r['inserted'] / steps:6.2f} / {r['updated'] / steps:5.2f} "
            f"[{r['hot'] / steps:5.2f}] / {r['deleted'] / steps:5.2f}"
        )
    lines.append("  index entries a step, by index:")
    for index, count in sorted(profile.index_entries.items(), key=lambda kv: -kv[1]):
        lines.append(f"    {index:<48} {count / steps:6.2f}")
    lines.append("  WAL bytes a step, by record type:")
    for kind, size in list(profile.wal_records.items())[:8]:
        lines.append(f"    {kind:<48} {size / steps:8.0f}")
    lines.append("  WAL bytes a step, by table (its indexes and TOAST included):")
    for table, size in list(profile.wal_tables.items())[:8]:
        lines.append(f"    {table:<48} {size / steps:8.0f}")
    lines.append("  statements by calls a step (ms a step):")
    for s in sorted(profile.top, key=lambda s: -int(s["calls"]))[:10]:
        query = " ".join(s["query"].split())
        nested = "" if s["toplevel"] and not TRIGGER_ROW.search(query) else "(trigger) "
        lines.append(
            f"    {s['calls'] / steps:5.2f} ({s['total_ms'] / steps:6.3f})  {nested}{query[:90]}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.step_cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--jobs", type=int, default=300, help="chain jobs measured")
    parser.add_argument("--items", type=int, default=1000, help="items of the fan-out job")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--profile-worker",
        nargs="?",
        const="",
        metavar="DIR",
        help="record the worker with py-spy during the chain (into DIR/worker.txt if given) and "
        "print its CPU by part (slows the worker: the counts hold, the CPU figures of such a run "
        "are not comparable)",
    )
    parser.add_argument(
        "--base",
        metavar="REV",
        help="measure git revision REV too, checked out in a temporary git worktree and "
        "migrated by its own migrations, alternating with the head",
    )
    parser.add_argument("--rounds", type=int, default=1, help="runs of each side")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, on_sigterm)
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="flowbeat-stepcost-")))
        pg = stack.enter_context(own_postgres())
        with psycopg.connect(pg.conninfo(), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET pg_stat_statements.track = 'all'")
            conn.execute("SELECT pg_reload_conf()")
        server = stack.enter_context(own_redis(tmp))
        base = stack.enter_context(worktree(args.base)) if args.base else None
        sides: dict[str, Checkout | None] = {"head": None} | ({"base": base} if base else {})
        runs: list[Profile] = []

        sizes = {"chain": args.jobs, "fan-out": args.items}

        def side(label: str, checkout: Checkout | None, number: int) -> list[Profile]:
            found = []
            for name, size in sizes.items():
                where = tmp / f"{label}-{number}-{name}"
                where.mkdir()
                spy = _spy_dir(args.profile_worker, where) if name == "chain" else None
                found.append(measure(pg, server.url, where, name, size, spy, checkout))
                log(f"{label}: {name} measured")
            return found

        for number in range(args.rounds):
            turn: dict[str, Callable[[], list[Profile]]] = {
                label: partial(side, label, c, number) for label, c in sides.items()
            }
            runs += [p for found in in_turn(number, turn).values() for p in found]
    if args.json:
        print(json.dumps([asdict(p) for p in runs], indent=2, default=str))
        return 0
    head = [p for p in runs if p.side == "head"][-len(sizes) :]
    for profile in head:
        print("\n".join(report(profile)))
    if len(runs) > len(head):
        print("\n".join(side_by_side(runs, args.base)))
    print("\n(the CPU figure depends on the machine's load; the counts do not)")
    if args.profile_worker is not None:
        print("\n".join(_worker_lines(head[0].worker)))
    return 0


_COUNTS: dict[str, Callable[[Profile], float]] = {
    "statements sent": lambda p: p.statements["sent"],
    "statements run by triggers": lambda p: p.statements["by_triggers"],
    "commits": lambda p: p.commits,
    "WAL bytes": lambda p: p.wal["bytes"],
    "  of which full-page images": lambda p: p.wal["fpi_bytes"],
    "index entries written": lambda p: sum(p.index_entries.values()),
    "PostgreSQL CPU (ms)": lambda p: 1000 * p.postgres_cpu_s,
}
"""What ``side_by_side`` sets out a step for every run: the counts, and the one figure that
drifts with the machine."""


def side_by_side(runs: list[Profile], base: str | None) -> list[str]:
    """Each profile's counts a step, run by run in the order they ran, and each side's median."""
    lines = ["", f"side by side, a step, in the order the runs ran (base: {base or 'none'}):"]
    for name in dict.fromkeys(p.name for p in runs):
        mine = [p for p in runs if p.name == name]
        seen: Counter[str] = Counter()
        labels = []
        for p in mine:
            seen[p.side] += 1
            labels.append(f"{p.side} {seen[p.side]}")
        sides = list(dict.fromkeys(p.side for p in mine))
        lines.append(
            f"  {name:<30}"
            + "".join(f"{label:>10}" for label in labels)
            + "".join(f"{side + ' median':>14}" for side in sides)
        )
        for label, value in _COUNTS.items():
            values = [value(p) / p.steps for p in mine]
            medians = [
                statistics.median(value(p) / p.steps for p in mine if p.side == side)
                for side in sides
            ]
            lines.append(
                f"  {label:<30}"
                + "".join(f"{v:10.2f}" for v in values)
                + "".join(f"{m:14.2f}" for m in medians)
            )
    return lines


def _spy_dir(wanted: str | None, tmp: Path) -> Path | None:
    """``--profile-worker``'s directory: the one given, or the run's temp directory."""
    if wanted is None:
        return None
    return Path(wanted) if wanted else tmp / "py-spy"


def _worker_lines(found: Parts | None) -> list[str]:
    if found is None:
        return ["", "worker CPU by part: py-spy recorded nothing (see the log above)"]
    return [
        "",
        "worker CPU by part, the chain only (py-spy of the worker and its pool, samples holding",
        "the GIL; by library: the innermost frame from a listed library, the standard library",
        "charged to its caller; leaf: the innermost frame's own part):",
        *parts_table(found),
        "(py-spy slowed the worker: this run's counts are exact, its CPU figures, the PostgreSQL",
        "CPU above included, are not comparable with a run without --profile-worker)",
    ]


if __name__ == "__main__":
    sys.exit(main())
