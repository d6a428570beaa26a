"""The job list filtered by labels over a million jobs: with ``ix_jobs_labels`` against the
same statement planned without it, side by side in one run.

    python -m bench.label_filter [--jobs 1000000] [--rounds 5] [--json]

``--jobs`` jobs are generated in a fresh database by one ``INSERT ... SELECT generate_series``
(not timed): 20 owners, each job labelled ``tenant: t<n % 1000>`` and ``study: <n % 97>``, a
third of them failed with ``http_status``. Each filter is the statement the list route sends
(``service.engine.jobs.list_query``: the first page of 50, newest first, as an owner's key sees
it), run in alternating rounds: A with every index, B with bitmap scans off, so the planner
cannot use the GIN index (it walks ``created_at`` backwards, or scans the table, and filters).
Each round times ``--repeat`` executions of each side; the ratio is B's median over A's. The
buffers each side touches (``EXPLAIN (ANALYZE, BUFFERS)``) do not drift with the machine's load,
and A's plan is printed. The database is dropped on the way out.
"""

import argparse
import json
import statistics
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from sqlalchemy import create_engine

from service.engine.filters import JobFilter
from service.engine.jobs import list_query
from service.platform.migrate import upgrade
from tests.support.servers import admin_database_url, create_test_database, drop_test_database

PAGE = 50
LOAD = """
SET session_replication_role = replica;
INSERT INTO jobs (id, owner, pipeline, profile, profile_hash, params, status, trigger,
                  request_hash, created_at, finished_at, labels, error)
SELECT gen_random_uuid(), 'o' || n % 20, 'p' || n % 10, '{}', '', '{}',
       CASE WHEN n % 3 = 0 THEN 'failed' ELSE 'succeeded' END, 'api', '',
       now() - make_interval(secs => n), now() - make_interval(secs => n),
       jsonb_build_object('tenant', 't' || n % 1000, 'study', (n % 97)::text),
       CASE WHEN n % 3 = 0 THEN '{"code": "http_status"}'::jsonb END
  FROM generate_series(1, %(jobs)s) AS n;
SET session_replication_role = origin;
ANALYZE jobs;
"""
CASES = {
    "tenant t7 and study 3 (about 10 jobs)": (
        "o7",
        JobFilter(labels={"tenant": "t7", "study": "3"}),
    ),
    "tenant t7 (1,000 jobs, 20 pages)": ("o7", JobFilter(labels={"tenant": "t7"})),
    "tenant t9, failed with http_status": (
        "o9",
        JobFilter(labels={"tenant": "t9"}, error_code="http_status"),
    ),
    "admin: tenant t7 and study 3, every owner": (
        None,
        JobFilter(labels={"tenant": "t7", "study": "3"}),
    ),
}


def statement(owner: str | None, match: JobFilter) -> tuple[str, dict[str, Any]]:
    """The list route's statement and its parameters, as psycopg takes them."""
    dialect = create_engine("postgresql+psycopg://").dialect
    compiled = list_query(owner, match, PAGE).compile(dialect=dialect)
    params = {k: Jsonb(v) if isinstance(v, dict) else v for k, v in compiled.params.items()}
    return str(compiled), params


@contextmanager
def database(jobs: int) -> Iterator[str]:
    admin = admin_database_url()
    name = f"flowbeat_bench_{uuid.uuid4().hex[:10]}"
    url = create_test_database(admin, name)
    try:
        upgrade(url)
        with psycopg.connect(url.replace("+psycopg", ""), autocommit=True) as conn:
            conn.execute(LOAD.replace("%(jobs)s", str(int(jobs))))
        yield url.replace("+psycopg", "")
    finally:
        drop_test_database(admin, name)


def timed(conn: psycopg.Connection[Any], sql: str, params: dict[str, Any], repeat: int) -> float:
    """The median of ``repeat`` executions, in ms, after one to warm the cache."""
    conn.execute(sql, params).fetchall()
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        conn.execute(sql, params).fetchall()
        runs.append((time.perf_counter() - started) * 1000)
    return statistics.median(runs)


def explained(conn: psycopg.Connection[Any], sql: str, params: dict[str, Any]) -> dict[str, Any]:
    [[plan]] = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params).fetchall()
    top = plan[0]["Plan"]
    text_plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql, params).fetchall()
    return {
        "buffers": top["Shared Hit Blocks"] + top["Shared Read Blocks"],
        "rows": top["Actual Rows"],
        "plan": "\n".join(line for (line,) in text_plan),
    }


def side(conn: psycopg.Connection[Any], indexed: bool) -> None:
    conn.execute(f"SET enable_bitmapscan = {'on' if indexed else 'off'}")


def run(jobs: int, rounds: int, repeat: int) -> dict[str, Any]:
    report: dict[str, Any] = {"jobs": jobs, "rounds": rounds, "repeat": repeat, "cases": {}}
    with database(jobs) as url, psycopg.connect(url, autocommit=True) as conn:
        for name, (owner, match) in CASES.items():
            sql, params = statement(owner, match)
            ms: dict[str, list[float]] = {"A": [], "B": []}
            for number in range(rounds):
                for label in "AB" if number % 2 == 0 else "BA":
                    side(conn, label == "A")
                    ms[label].append(timed(conn, sql, params, repeat))
            side(conn, True)
            a = explained(conn, sql, params)
            side(conn, False)
            b = explained(conn, sql, params)
            side(conn, True)
            assert a["rows"] == b["rows"]
            report["cases"][name] = {
                "rows": a["rows"],
                "ms_with_index": [round(v, 2) for v in ms["A"]],
                "ms_without": [round(v, 2) for v in ms["B"]],
                "time_ratio_without_over_with": round(
                    statistics.median(ms["B"]) / statistics.median(ms["A"]), 1
                ),
                "buffers_with_index": a["buffers"],
                "buffers_without": b["buffers"],
                "plan_with_index": a["plan"],
            }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report = run(args.jobs, args.rounds, args.repeat)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{args.jobs:,} jobs; {args.rounds} alternating rounds of {args.repeat} runs a side")
    for name, case in report["cases"].items():
        print(f"\n{name}: {case['rows']} rows on the first page")
        print(
            f"  with ix_jobs_labels: median {statistics.median(case['ms_with_index']):.2f} ms, "
            f"{case['buffers_with_index']} buffers"
        )
        print(
            f"  without (bitmap scans off): median {statistics.median(case['ms_without']):.2f} ms, "
            f"{case['buffers_without']} buffers"
        )
        print(
            f"  without / with: time x{case['time_ratio_without_over_with']}, buffers "
            f"x{round(case['buffers_without'] / max(case['buffers_with_index'], 1), 1)}"
        )
        print("  plan with the index:")
        print("    " + case["plan_with_index"].replace("\n", "\n    "))


if __name__ == "__main__":
    main()
