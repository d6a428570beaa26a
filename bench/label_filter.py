"""The job list filtered by labels over a million jobs: as served, against the same statement
planned without ``ix_jobs_labels`` and against one generic plan, side by side in one run.

    python -m bench.label_filter [--jobs 1000000] [--rounds 5] [--json]

``--jobs`` jobs are generated in a fresh database by one ``INSERT ... SELECT generate_series``
(not timed): 20 owners, each job labelled ``tenant: t<n % 1000>`` and ``study: <n % 97>``, a
third of them failed with ``http_status``. Each filter is the first page of 50, newest first, as
``GET /v1/jobs`` asks for it (scoped to an owner as a non-admin key is, or not as an admin's),
in alternating rounds of ``--repeat`` executions a side:

A. served: ``service.engine.jobs.list_jobs`` on a session of the product's engine, which plans
   a label filter for its labels (``custom_plans``) however often the connection ran it;
B. no index: the same with bitmap scans off, so the planner cannot use the GIN index;
C. generic: the same statement (``list_query``) prepared with one generic plan, which
   PostgreSQL may settle on for a statement a connection has run five times.

The ratio is each side's median over A's. The buffers A and B touch (``EXPLAIN (ANALYZE,
BUFFERS)``) do not drift with the machine's load, and A's plan is printed. The database is
dropped on the way out.
"""

import argparse
import json
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session, sessionmaker

from service.engine.filters import JobFilter
from service.engine.jobs import list_jobs, list_query
from service.platform.db import make_engine, make_session_factory
from service.platform.migrate import upgrade
from tests.support.servers import admin_database_url, create_test_database, drop_test_database

PAGE = 50
LOAD = """
SET session_replication_role = replica;
INSERT INTO jobs (id, owner, pipeline, profile_hash, params, status, trigger,
                  request_hash, created_at, finished_at, labels, error)
SELECT gen_random_uuid(), 'o' || n % 20, 'p' || n % 10, '', '{}',
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


def median_ms(run: Callable[[], object], repeat: int) -> float:
    """The median of ``repeat`` runs, in ms, after one to warm the cache."""
    run()
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        runs.append((time.perf_counter() - started) * 1000)
    return statistics.median(runs)


def served(
    sessions: sessionmaker[Session], owner: str | None, match: JobFilter, indexed: bool
) -> Callable[[], object]:
    def run() -> object:
        with sessions() as session, session.begin():
            if not indexed:
                session.execute(text("SET LOCAL enable_bitmapscan = off"))
            return list_jobs(session, owner=owner, match=match, limit=PAGE)

    return run


def generic(
    conn: psycopg.Connection[Any], sql: str, params: dict[str, Any]
) -> Callable[[], object]:
    def run() -> object:
        return conn.execute(sql, params, prepare=True).fetchall()

    return run


def explained(
    conn: psycopg.Connection[Any], sql: str, params: dict[str, Any], indexed: bool
) -> dict[str, Any]:
    """The statement planned for its parameters, as ``custom_plans`` has it planned."""
    conn.execute("SET plan_cache_mode = force_custom_plan")
    conn.execute(f"SET enable_bitmapscan = {'on' if indexed else 'off'}")
    try:
        [[plan]] = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params).fetchall()
        lines = conn.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql, params).fetchall()
    finally:
        conn.execute("SET enable_bitmapscan = on")
        conn.execute("SET plan_cache_mode = force_generic_plan")
    top = plan[0]["Plan"]
    return {
        "buffers": top["Shared Hit Blocks"] + top["Shared Read Blocks"],
        "rows": top["Actual Rows"],
        "plan": "\n".join(line for (line,) in lines),
    }


def run(jobs: int, rounds: int, repeat: int) -> dict[str, Any]:
    report: dict[str, Any] = {"jobs": jobs, "rounds": rounds, "repeat": repeat, "cases": {}}
    with database(jobs) as url, psycopg.connect(url, autocommit=True) as conn:
        engine = make_engine(url.replace("postgresql://", "postgresql+psycopg://"))
        sessions = make_session_factory(engine)
        conn.execute("SET plan_cache_mode = force_generic_plan")
        for name, (owner, match) in CASES.items():
            sql, params = statement(owner, match)
            sides = {
                "A": served(sessions, owner, match, True),
                "B": served(sessions, owner, match, False),
                "C": generic(conn, sql, params),
            }
            ms: dict[str, list[float]] = {side: [] for side in sides}
            for number in range(rounds):
                for side in "ABC" if number % 2 == 0 else "CBA":
                    ms[side].append(median_ms(sides[side], repeat))
            a, b = explained(conn, sql, params, True), explained(conn, sql, params, False)
            assert a["rows"] == b["rows"]
            median = {side: statistics.median(values) for side, values in ms.items()}
            report["cases"][name] = {
                "rows": a["rows"],
                "ms": {side: [round(v, 2) for v in values] for side, values in ms.items()},
                "median_ms": {side: round(v, 2) for side, v in median.items()},
                "no_index_over_served": round(median["B"] / median["A"], 1),
                "generic_over_served": round(median["C"] / median["A"], 1),
                "buffers_served": a["buffers"],
                "buffers_no_index": b["buffers"],
                "plan_served": a["plan"],
            }
        engine.dispose()
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
        median = case["median_ms"]
        print(f"\n{name}: {case['rows']} rows on the first page")
        print(f"  A served:   median {median['A']} ms, {case['buffers_served']} buffers")
        print(f"  B no index: median {median['B']} ms, {case['buffers_no_index']} buffers")
        print(f"  C generic:  median {median['C']} ms")
        print(
            f"  B / A: time x{case['no_index_over_served']}, buffers "
            f"x{round(case['buffers_no_index'] / max(case['buffers_served'], 1), 1)}; "
            f"C / A: time x{case['generic_over_served']}"
        )
        print("  plan served:")
        print("    " + case["plan_served"].replace("\n", "\n    "))


if __name__ == "__main__":
    main()
