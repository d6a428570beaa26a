"""The diff of two runs in PostgreSQL against the same diff with Python sets in one process.

    python -m bench.diff_million [--items 1000000] [--json]

Two runs of ``--items`` item keys each, half overlapping, are loaded into ``result_items`` of a
fresh database with ``INSERT ... SELECT generate_series`` (not timed). Then, each timed after a
warm-up run:

A. the database: ``service.catalogue.diffs.count_against`` (new, removed, unchanged by anti-joins
   on the primary key, as computed when a run succeeds) and the first page of 100 new items, as
   ``GET /v1/jobs/{id}/diff`` returns it;
B. Python: both runs' keys fetched into two sets, then the three set differences and the
   first 100 new keys in order, as a service would do without the database diff.

Peak memory of this process is measured with tracemalloc for both, in a run of its own. The
database is dropped on the way out.
"""

import argparse
import json
import os
import time
import tracemalloc
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from service.catalogue.diffs import DiffKind, count_against, diff_page
from service.platform.db import make_engine, make_session_factory
from service.platform.models import JobRow
from tests.support.servers import private_database

PAGE = 100

_JOB = text(
    """
    INSERT INTO jobs (id, owner, pipeline, profile_hash, params, status, trigger,
                      request_hash, created_at, finished_at, item_count, previous_job_id)
    VALUES (:id, 'bench', 'bench-diff', '', '{}', 'queued', 'api', '', now(), now(),
            :count, :previous)
    """
)
_MOVE = text("UPDATE jobs SET status = :status WHERE id IN (:before, :after)")
"""A job is stored queued and moves as the lifecycle table lets it (migration 0020 refuses
any other first status), to end succeeded."""
_ITEMS = text(
    """
    INSERT INTO result_items (job_id, item_key, item)
    SELECT :job_id, lpad(n::text, 9, '0'), jsonb_build_object('id', n, 'title', 'paper ' || n)
      FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS n
    """
)


@dataclass(frozen=True)
class Measure:
    seconds: float
    peak_mib: float
    counts: dict[str, int]


def _measure(fn: Callable[[], dict[str, int]]) -> Measure:
    """Warm up, time one run, then trace the memory of another: tracing slows Python down."""
    fn()
    started = time.perf_counter()
    counts = fn()
    seconds = time.perf_counter() - started
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return Measure(seconds, peak / 2**20, counts)


def _load(session: Session, items: int) -> tuple[JobRow, uuid.UUID]:
    before, after = uuid.uuid4(), uuid.uuid4()
    half = items // 2
    session.execute(_JOB, {"id": before, "count": items, "previous": None})
    session.execute(_JOB, {"id": after, "count": items, "previous": before})
    for status in ("running", "succeeded"):
        session.execute(_MOVE, {"status": status, "before": before, "after": after})
    session.execute(_ITEMS, {"job_id": before, "first": 0, "last": items - 1})
    session.execute(_ITEMS, {"job_id": after, "first": half, "last": half + items - 1})
    session.execute(text("ANALYZE result_items"))
    job = session.get(JobRow, after)
    assert job is not None
    return job, before


def _in_database(session: Session, job: JobRow) -> dict[str, int]:
    counts = count_against(session, job.id, job.previous_job_id)[1].as_dict()
    page = diff_page(session, job, DiffKind.NEW, limit=PAGE)
    assert len(page.items) == min(PAGE, counts["new"])
    return counts


def _keys(session: Session, job_id: uuid.UUID) -> set[str]:
    rows = session.execute(
        text("SELECT item_key FROM result_items WHERE job_id = :job_id"), {"job_id": job_id}
    )
    return {key for (key,) in rows}


def _in_python(session: Session, job: JobRow, previous: uuid.UUID) -> dict[str, int]:
    current, before = _keys(session, job.id), _keys(session, previous)
    new, removed, unchanged = current - before, before - current, current & before
    first_page = sorted(new)[:PAGE]
    assert len(first_page) == min(PAGE, len(new))
    return {"new": len(new), "removed": len(removed), "unchanged": len(unchanged)}


def run(items: int) -> dict[str, Any]:
    with private_database("flowbeat_bench") as url:
        engine = make_engine(url)
        sessions = make_session_factory(engine)
        try:
            with sessions() as session, session.begin():
                started = time.perf_counter()
                job, previous = _load(session, items)
                load_s = time.perf_counter() - started
            with sessions() as session:
                database = _measure(lambda: _in_database(session, job))
                python = _measure(lambda: _in_python(session, job, previous))
        finally:
            engine.dispose()
    assert database.counts == python.counts
    return {
        "items_per_run": items,
        "cpus": os.cpu_count(),
        "load_s": round(load_s, 2),
        "database": asdict(database),
        "python_sets": asdict(python),
        "time_ratio_python_over_database": round(python.seconds / database.seconds, 2),
        "memory_ratio_python_over_database": round(python.peak_mib / database.peak_mib, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report = run(args.items)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    db, py = report["database"], report["python_sets"]
    print(f"{args.items:,} item keys per run, half overlapping; counts {db['counts']}")
    print(f"load (not timed in the diff): {report['load_s']} s")
    print(f"database diff + first page: {db['seconds']:.3f} s, peak {db['peak_mib']:.2f} MiB")
    print(f"python sets + first page:   {py['seconds']:.3f} s, peak {py['peak_mib']:.2f} MiB")
    print(
        f"python / database: time x{report['time_ratio_python_over_database']}, "
        f"memory x{report['memory_ratio_python_over_database']}"
    )


if __name__ == "__main__":
    main()
