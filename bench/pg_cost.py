"""PostgreSQL's CPU per job of the chain bench, measured alone: what the database costs.

    python -m bench.pg_cost [--jobs 2000] [--rounds 3] [--json]

The chain bench's job (three no-op steps) is accepted with the API's one-statement insert, on a
connection that plans it once as the API's do, and run by the worker's own service calls (a
claim, two checkpoints that each claim the next step, a checkpoint that settles the job), in
this one process, one job after another, with no HTTP, Celery or Redis around them. What the
PostgreSQL backends of the database spend in between is the database's own cost of a job, to
set beside what the full bench reads for the same backends while everything else competes for
the cores.

Each round runs twice on fresh databases, in alternating order: as migrated, and with the event
log's triggers disabled. The difference is the most that any change to how events are appended
could save. Rounds are calibrated as the chain bench's are.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psycopg

from bench.cpu import CpuMeter
from bench.harness import DEFAULT_ADMIN_DB, PIPELINE, PROFILE_YAML, fresh_database
from bench.rounds import calibrate
from bench.stack import disable_event_log

VARIANTS = ("as migrated", "without event triggers")
OWNER = "bench"
WARMUP_JOBS = 20


@dataclass
class Cost:
    variant: str
    accept_ms: float
    run_ms: float

    @property
    def total_ms(self) -> float:
        return self.accept_ms + self.run_ms


@contextmanager
def runtime_on(db_url: str, profiles: Path) -> Iterator[Any]:
    from service.engine.runtime import Runtime
    from service.platform.settings import Settings

    settings = Settings(database_url=db_url, broker_url="redis://unused", profiles_dir=profiles)
    rt = Runtime.start(settings, pool_size=1)
    try:
        yield rt
    finally:
        rt.sessions.kw["bind"].dispose()


def _first_job(rt: Any) -> uuid.UUID:
    """One job through ``submit_job``, so the name's resolution is known as the API knows it."""
    from service.engine.submission import JobRequest, submit_job
    from service.platform.db import unit_of_work

    with unit_of_work(rt.sessions) as session:
        job, _ = submit_job(
            session,
            JobRequest(pipeline=PIPELINE, params={}),
            owner=OWNER,
            profiles_dir=rt.settings.profiles_dir,
            known_actions=rt.registry.names(),
        )
    return uuid.UUID(str(job.id))


async def _accept(rt: Any, conn: psycopg.AsyncConnection[Any], jobs: int) -> list[uuid.UUID]:
    from service.catalogue.resolution import seen_resolution
    from service.engine.intake import insert_jobs_if_resolved, new_job
    from service.engine.submission import JobRequest

    resolved = seen_resolution(
        PIPELINE,
        owner=OWNER,
        profiles_dir=rt.settings.profiles_dir,
        known_actions=rt.registry.names(),
    )
    assert resolved is not None
    ids = []
    for _ in range(jobs):
        request = JobRequest(pipeline=PIPELINE, params={})
        job = new_job(request, resolved, owner=OWNER, name=PIPELINE)
        stored = await insert_jobs_if_resolved(conn, [job], open_jobs_limit=0)
        assert stored == {job.id}
        ids.append(job.id)
    return ids


def _run(rt: Any, ids: list[uuid.UUID]) -> None:
    from service.engine import runner
    from service.engine.shards import FannedOut
    from service.engine.steps import StepKey

    inline = runner.Inline(
        fits=lambda _timeout_s: True, timed=lambda _timeout_s: nullcontext(), send=lambda _: None
    )
    for job_id in ids:
        plan = runner.run_step(rt, StepKey(job_id, "a"), task_id=uuid.uuid4().hex, inline=inline)
        assert not isinstance(plan, FannedOut) and not plan.steps, plan


def measure(admin_db: str, profiles: Path, variant: str, jobs: int) -> Cost:
    from service.platform.db import libpq_url
    from service.platform.migrate import upgrade

    with fresh_database(admin_db) as db_url:
        upgrade(db_url)
        if variant != VARIANTS[0]:
            disable_event_log(db_url)
        with runtime_on(db_url, profiles) as rt:
            return asyncio.run(_measured(rt, libpq_url(db_url), variant, jobs))


async def _measured(rt: Any, conninfo: str, variant: str, jobs: int) -> Cost:
    """Every connection is opened before the meter starts: it counts the backends it sees."""
    from service.engine.intake import plan_once

    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as api_conn:
        await plan_once(api_conn)
        with psycopg.connect(conninfo) as meter_conn:
            _run(rt, [_first_job(rt), *await _accept(rt, api_conn, WARMUP_JOBS)])
            meter = CpuMeter({}, meter_conn)
            meter.start()
            ids = await _accept(rt, api_conn, jobs)
            accept_s = meter.stop()["postgres"]
            meter.start()
            _run(rt, ids)
            run_s = meter.stop()["postgres"]
            _check_all_succeeded(meter_conn, jobs + 1 + WARMUP_JOBS)
    return Cost(variant, 1000 * accept_s / jobs, 1000 * run_s / jobs)


def _check_all_succeeded(conn: psycopg.Connection[Any], total: int) -> None:
    row = conn.execute("SELECT count(*) FROM jobs WHERE status = 'succeeded'").fetchone()
    if row is None or row[0] != total:
        raise RuntimeError(f"{row} of {total} jobs succeeded")


def alternated(rounds: int, side: Callable[[str], Cost]) -> list[list[Cost]]:
    results = []
    for number in range(rounds):
        order = VARIANTS if number % 2 == 0 else tuple(reversed(VARIANTS))
        by_variant = {variant: side(variant) for variant in order}
        results.append([by_variant[variant] for variant in VARIANTS])
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000, help="timed jobs per variant a round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--admin-db", default=DEFAULT_ADMIN_DB)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    with ExitStack() as stack:
        profiles = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="pg-cost-")))
        (profiles / f"{PIPELINE}.yaml").write_text(PROFILE_YAML)
        before = calibrate()
        rounds = alternated(
            args.rounds, lambda variant: measure(args.admin_db, profiles, variant, args.jobs)
        )
        after = calibrate()
    _report(args, rounds, {"before": before, "after": after})
    return 0


def _report(
    args: argparse.Namespace, rounds: list[list[Cost]], calibration: dict[str, dict[str, float]]
) -> None:
    medians = {
        variant: {
            part: statistics.median(getattr(r[i], part) for r in rounds)
            for part in ("accept_ms", "run_ms", "total_ms")
        }
        for i, variant in enumerate(VARIANTS)
    }
    if args.json:
        document = {
            "rounds": [[{**asdict(c), "total_ms": c.total_ms} for c in r] for r in rounds],
            "medians": medians,
            "calibration": calibration,
        }
        print(json.dumps(document, indent=2))
        return
    print(f"\nPostgreSQL CPU per job of the chain bench, {args.jobs} jobs a variant and round")
    for number, pair in enumerate(rounds, 1):
        line = "; ".join(
            f"{c.variant}: {c.total_ms:.2f} (accept {c.accept_ms:.2f}, run {c.run_ms:.2f})"
            for c in pair
        )
        print(f"  round {number}: {line} ms")
    for variant, parts in medians.items():
        print(
            f"  median, {variant}: {parts['total_ms']:.2f} ms a job "
            f"(accept {parts['accept_ms']:.2f}, run {parts['run_ms']:.2f})"
        )
    with_log, without = (medians[v]["total_ms"] for v in VARIANTS)
    print(f"  the event log's triggers: {with_log - without:.2f} ms a job")
    for moment, figures in calibration.items():
        print(f"  calibration {moment}: " + ", ".join(f"{k} {v:.2f}" for k, v in figures.items()))


if __name__ == "__main__":
    sys.exit(main())
