"""What the home page's queries read from a jobs table of many jobs: their plans, the rows their
scans touch and the pages they hit, against the size of the table.

    python -m bench.overview_plans [--jobs 100000] [--days 30] [--json]

``--jobs`` jobs are loaded into ``jobs`` of a fresh database with ``INSERT ... SELECT
generate_series``, one every ``--days`` days' share, newest now, across 20 owners and 50
pipelines, every tenth failed, the newest 50 still open; then ``VACUUM ANALYZE``. Each query
``GET /v1/overview`` runs for the last hour and the last day (``service.engine.overview``) is
captured as the service function sends it and run again under ``EXPLAIN (ANALYZE, BUFFERS)``,
for an admin key (every owner) and for one owner's key. The figures are counts, which do not
drift with the machine's load: the scans' node types, the rows they returned and filtered
out, and the shared buffers touched, beside the table's rows and pages. The database is dropped
on the way out.
"""

import argparse
import json
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import timedelta
from functools import partial
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.orm import Session

from bench.harness import fresh_database
from service.engine import overview
from service.platform.clock import utcnow
from service.platform.db import make_engine, make_session_factory
from service.platform.migrate import upgrade
from tests.support.servers import admin_database_url

OWNERS, PIPELINES, OPEN = 20, 50, 50

_LOAD = text(
    """
    INSERT INTO jobs (id, owner, pipeline, profile_hash, params, status, trigger,
                      request_hash, created_at, started_at, finished_at)
    SELECT gen_random_uuid(), 'owner-' || (n % :owners), 'pipe-' || (n % :pipelines),
           '', '{}', s.status, 'api', '', c.at,
           CASE WHEN s.status <> 'queued' THEN c.at + interval '1 second' END,
           CASE WHEN n >= :open THEN c.at + (1 + n % 97) * interval '1 second' END
      FROM generate_series(0, :jobs - 1) AS n,
           LATERAL (SELECT now() - n * CAST(:every AS interval) AS at) AS c,
           LATERAL (SELECT CASE WHEN n < :open THEN (ARRAY['queued', 'running'])[1 + n % 2]
                                WHEN n % 10 = 0 THEN 'failed'
                                WHEN n % 31 = 0 THEN 'cancelled'
                                ELSE 'succeeded' END AS status) AS s
    """
)


@dataclass(frozen=True)
class Plan:
    query: str
    scans: list[str]
    """Each scan node with the index it used, as ``EXPLAIN`` names them."""
    rows_read: int
    """Rows the scans took from the table, those a condition then dropped included."""
    rows_filtered: int
    """Of those, the rows dropped for a condition the index did not hold."""
    bitmap_entries: int
    """Index entries bitmap index scans collected before the table was read."""
    buffers: int
    result_rows: int


def _load(url: str, jobs: int, days: float) -> None:
    """Rows put in place as they stand, not walked through the lifecycle: its triggers are
    off for this session (``session_replication_role``), as a restore would load them."""
    engine = make_engine(url)
    every = timedelta(days=days) / jobs
    try:
        with engine.begin() as conn:
            conn.execute(text("SET LOCAL session_replication_role = replica"))
            conn.execute(
                _LOAD,
                {
                    "jobs": jobs,
                    "owners": OWNERS,
                    "pipelines": PIPELINES,
                    "open": OPEN,
                    "every": every,
                },
            )
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE jobs"))
    finally:
        engine.dispose()


def _scans(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if "Scan" in node["Node Type"]:
        yield node
    for child in node.get("Plans", []):
        yield from _scans(child)


def _explained(session: Session, name: str, statement: str, params: Any) -> Plan:
    raw = session.connection().connection.dbapi_connection
    assert raw is not None
    cursor = raw.cursor()
    try:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}", params)
        row = cursor.fetchone()
    finally:
        cursor.close()
    assert row is not None
    top = row[0][0]["Plan"]
    scans = list(_scans(top))
    table = [s for s in scans if s["Node Type"] != "Bitmap Index Scan"]
    dropped = sum(
        int(s.get("Rows Removed by Filter", 0)) + int(s.get("Rows Removed by Index Recheck", 0))
        for s in table
    )
    return Plan(
        name,
        [
            f"{s['Node Type']} {s.get('Index Name', s.get('Relation Name', ''))}".strip()
            for s in scans
        ],
        sum(_rows(s) for s in table) + dropped,
        dropped,
        sum(_rows(s) for s in scans if s["Node Type"] == "Bitmap Index Scan"),
        int(top.get("Shared Hit Blocks", 0)) + int(top.get("Shared Read Blocks", 0)),
        int(top["Actual Rows"]),
    )


def _rows(node: dict[str, Any]) -> int:
    return int(node["Actual Rows"]) * int(node.get("Actual Loops", 1))


def _captured(session: Session, name: str, call: Callable[[], object]) -> Plan:
    """The one statement ``call`` sends, run again under ``EXPLAIN``."""
    sent: list[tuple[str, Any]] = []

    def note(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
        sent.append((statement, params))

    engine = session.get_bind()
    event.listen(engine, "before_cursor_execute", note)
    try:
        call()
    finally:
        event.remove(engine, "before_cursor_execute", note)
    ((statement, params),) = sent
    return _explained(session, name, statement, params)


FIGURES: dict[str, Callable[..., object]] = {
    "throughput": overview.throughput,
    "slowest": overview.slowest_pipelines,
    "failing": overview.failing_pipelines,
}


def _plans(session: Session, owner: str | None) -> list[Plan]:
    now = utcnow()
    plans = [
        _captured(
            session,
            f"{name} ({span.value})",
            partial(figure, session, overview.Window.ending(span, now), owner=owner),
        )
        for span in overview.Span
        for name, figure in FIGURES.items()
    ]
    plans.append(_captured(session, "open jobs", partial(overview.open_jobs, session, owner=owner)))
    return plans


def run(jobs: int, days: float) -> dict[str, Any]:
    with fresh_database(admin_database_url()) as url:
        upgrade(url)
        _load(url, jobs, days)
        engine = make_engine(url)
        try:
            with make_session_factory(engine)() as session:
                rows, pages = session.execute(
                    text("SELECT reltuples::bigint, relpages FROM pg_class WHERE relname = 'jobs'")
                ).one()
                every_owner = _plans(session, None)
                one_owner = _plans(session, "owner-1")
        finally:
            engine.dispose()
    return {
        "jobs": jobs,
        "days": days,
        "table_rows": rows,
        "table_pages": pages,
        "admin_key": [asdict(p) for p in every_owner],
        "one_owner": [asdict(p) for p in one_owner],
    }


def _print(report: dict[str, Any]) -> None:
    rows, pages = report["table_rows"], report["table_pages"]
    print(f"jobs: {rows:,} rows in {pages:,} pages, over {report['days']:g} days")
    for who in ("admin_key", "one_owner"):
        print(f"\n{who.replace('_', ' ')}:")
        print(
            f"  {'query':<18} {'rows read':>9} {'filtered':>8} {'of table':>8}"
            f" {'bitmap':>7} {'buffers':>7}  scans"
        )
        for plan in report[who]:
            read = plan["rows_read"]
            print(
                f"  {plan['query']:<18} {read:>9,} {plan['rows_filtered']:>8,} {read / rows:>8.2%}"
                f" {plan['bitmap_entries']:>7,} {plan['buffers']:>7,}  {'; '.join(plan['scans'])}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report = run(args.jobs, args.days)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print(report)


if __name__ == "__main__":
    main()
