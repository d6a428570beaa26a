"""The sweeper's scans as the jobs table grows: one pass of the lost-message sweep, the
lost-notice scan and the retention prune, timed on a bench's database as it stands and again
after it is grown.

The database is grown by copying one finished job of the chain bench, with its step runs,
under fresh ids, with triggers and foreign-key checks off for the copy
(``session_replication_role = replica``): a table of jobs as a busy deployment keeps them
until retention deletes them. Each copy also has a notify URL and the two events of a notice
of new items that was delivered, as a scheduled diff search leaves them. The passes call the
service functions the sweep task calls (``service.engine.sweeper.sweep``,
``service.catalogue.notices.requeue_lost_notices``, ``service.catalogue.retention.prune_all``)
in this process, in a transaction rolled back after, with no broker: what they cost is their
queries.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench.pg_cost import runtime_on

PASSES = 3
GROW_BATCH = 100_000
NOTIFY_URL = "https://hooks.example.org/new-items"


def _columns(conn: psycopg.Connection[Any], table: str) -> list[str]:
    """The columns a copy sets: all but those the table fills in itself."""
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
        "AND table_schema = current_schema() AND is_identity = 'NO' "
        "AND coalesce(column_default, '') NOT LIKE 'nextval%%' ORDER BY ordinal_position",
        (table,),
    ).fetchall()
    return [str(row[0]) for row in rows]


def _copy(conn: psycopg.Connection[Any], table: str, key: str, template: Any) -> None:
    """``table``'s rows whose ``key`` is ``template``, once for each id in ``new_ids``."""
    columns = _columns(conn, table)
    chosen = [
        sql.SQL("n.id") if column == key else sql.SQL("t.{}").format(sql.Identifier(column))
        for column in columns
    ]
    conn.execute(
        sql.SQL("INSERT INTO {} ({}) SELECT {} FROM new_ids n, {} t WHERE t.{} = %s").format(
            sql.Identifier(table),
            sql.SQL(", ").join(map(sql.Identifier, columns)),
            sql.SQL(", ").join(chosen),
            sql.Identifier(table),
            sql.Identifier(key),
        ),
        (template,),
    )


def grow(conninfo: str, jobs: int) -> int:
    """Copies of a finished job until the table holds ``jobs``; returns how many it holds."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")
        row = conn.execute("SELECT id FROM jobs WHERE status = 'succeeded' LIMIT 1").fetchone()
        assert row is not None, "no finished job to copy"
        while (count := _count(conn)) < jobs:
            batch = min(GROW_BATCH, jobs - count)
            with conn.transaction():
                conn.execute(
                    "CREATE TEMP TABLE new_ids ON COMMIT DROP AS "
                    "SELECT gen_random_uuid() AS id FROM generate_series(1, %s)",
                    (batch,),
                )
                _copy(conn, "jobs", "id", row[0])
                _copy(conn, "step_runs", "job_id", row[0])
                _delivered_notices(conn)
        conn.execute("VACUUM ANALYZE jobs")
        conn.execute("VACUUM ANALYZE step_runs")
        conn.execute("VACUUM ANALYZE job_events")
        return count


def _delivered_notices(conn: psycopg.Connection[Any]) -> None:
    """The jobs in ``new_ids`` as diff runs whose notice of new items was delivered."""
    conn.execute(
        "UPDATE jobs SET notify_url = %s WHERE id IN (SELECT id FROM new_ids)", (NOTIFY_URL,)
    )
    conn.execute(
        "INSERT INTO job_events (job_id, kind, data) SELECT n.id, k.kind, '{}'::jsonb"
        " FROM new_ids AS n, unnest(ARRAY['new_items', 'notified']) AS k(kind)"
    )


def _count(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM jobs").fetchone()
    return int(row[0]) if row else 0


def one_pass(rt: Any) -> float:
    """Seconds of one pass: the lost-message scans, the lost-notice scan, then the retention
    prune."""
    from service.catalogue.notices import requeue_lost_notices
    from service.catalogue.retention import RetentionPolicy, prune_all
    from service.engine import sweeper
    from service.platform.clock import utcnow

    settings = rt.settings
    started = time.perf_counter()
    with rt.sessions() as session:
        now = utcnow()
        sweeper.sweep(
            session,
            now=now,
            broker_lost=False,
            stall_after_s=settings.stall_after_s,
            dispatch_grace_s=settings.dispatch_grace_s,
            oldest_waiting={},
            held=frozenset(),
        )
        requeue_lost_notices(session, older_than=now, now=now)
        prune_all(session, now, RetentionPolicy.of(settings))
        session.rollback()
    return time.perf_counter() - started


def measure_sweeps(db_url: str, profiles: Path, sizes: list[int]) -> list[dict[str, float]]:
    """The fastest of ``PASSES`` passes at the database's size, then at each of ``sizes``."""
    from service.platform.db import libpq_url

    found = []
    with runtime_on(db_url, profiles) as rt:
        for size in [0, *sizes]:
            jobs = grow(libpq_url(db_url), size)
            one_pass(rt)
            best = min(one_pass(rt) for _ in range(PASSES))
            found.append({"jobs": float(jobs), "pass_ms": 1000 * best})
    return found
