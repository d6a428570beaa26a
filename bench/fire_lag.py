"""Scheduler fire lag: seconds from a fire time to the creation of its job.

    python -m bench.fire_lag --fires 200 --schedules 4 [--replicas 1] [--json]

A fresh PostgreSQL database and Redis DB (the same pool the tests use), a profile of one no-op
step, ``--schedules`` interval schedules firing every second (the minimum-interval limit is
lowered for the run) made once ``--replicas`` beat processes running ``FlowbeatScheduler`` have
elected a leader. When the
schedules have fired ``--fires`` times in all, the beats stop and the lag of every job
(``created_at - scheduled_for``, both stamped in PostgreSQL) is read back: p50, p99 and max.
No worker runs, so the figure is the scheduler's alone. Not part of the test suite.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import create_engine, text

from tests.support.servers import (
    admin_database_url,
    allocate_redis_db,
    create_test_database,
    drop_test_database,
    redis_base_url,
    redis_db_url,
    release_redis_db,
)

REPO = Path(__file__).resolve().parent.parent
PROFILE = """\
name: tick
description: one no-op step, for bench.fire_lag
steps:
  - id: only
    action: noop
"""


def _schedule(env: dict[str, str], schedules: int) -> None:
    os.environ.update(env)
    from service.language.cron import ScheduleSpec
    from service.language.loading import find_profile
    from service.platform.clock import utcnow
    from service.platform.db import make_engine, make_session_factory, unit_of_work
    from service.platform.settings import get_settings
    from service.triggers.schedules import put_schedule

    get_settings.cache_clear()
    settings = get_settings()
    engine = make_engine(settings.require_database_url())
    profile = find_profile(settings.profiles_dir, "tick")
    with unit_of_work(make_session_factory(engine)) as session:
        for index in range(schedules):
            put_schedule(
                session,
                owner=f"bench-{index}",
                profile=profile,
                spec=ScheduleSpec(every="1s", overlap="allow"),
                settings=settings,
                now=utcnow(),
            )
    engine.dispose()


def _await_leader(broker_url: str) -> None:
    """Schedules are made once a leader runs, so start-up time does not count as lag."""
    from service.platform.constants import BEAT_LOCK_KEY

    client = redis.Redis.from_url(broker_url)
    deadline = time.monotonic() + 60
    while not client.exists(BEAT_LOCK_KEY) and time.monotonic() < deadline:
        time.sleep(0.2)
    client.close()


def _count(database_url: str) -> int:
    engine = create_engine(database_url)
    with engine.connect() as connection:
        value = connection.scalar(text("SELECT count(*) FROM jobs"))
    engine.dispose()
    return int(value or 0)


def _lags(database_url: str) -> list[float]:
    engine = create_engine(database_url)
    with engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT extract(epoch FROM created_at - scheduled_for) FROM jobs "
                "WHERE scheduled_for IS NOT NULL"
            )
        ).all()
    engine.dispose()
    return sorted(float(row[0]) for row in rows)


def _percentile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


def run(fires: int, schedules: int, replicas: int) -> dict[str, Any]:
    from service.platform.migrate import upgrade

    admin, name = admin_database_url(), f"flowbeat_bench_{uuid.uuid4().hex[:8]}"
    base, owner = redis_base_url(), f"bench-fire-lag-{os.getpid()}"
    database_url = create_test_database(admin, name)
    db = allocate_redis_db(base, owner)
    beats: list[subprocess.Popen[bytes]] = []
    try:
        upgrade(database_url)
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "tick.yaml").write_text(PROFILE, encoding="utf-8")
            env = {
                "FLOWBEAT_DATABASE_URL": database_url,
                "FLOWBEAT_BROKER_URL": redis_db_url(base, db),
                "FLOWBEAT_PROFILES_DIR": tmp,
                "FLOWBEAT_SCHEDULE_MIN_INTERVAL_S": "1",
            }
            for index in range(replicas):
                argv = [sys.executable, "-m", "celery", "-A", "tasks.app", "beat"]
                argv += ["-S", "scheduler.beat:FlowbeatScheduler", f"--schedule={tmp}/b{index}"]
                beats.append(
                    subprocess.Popen(
                        argv,
                        env={**os.environ, **env, "PYTHONPATH": str(REPO)},
                        cwd=REPO,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
            _await_leader(redis_db_url(base, db))
            _schedule(env, schedules)
            deadline = time.monotonic() + fires / schedules * 2 + 60
            while _count(database_url) < fires and time.monotonic() < deadline:
                time.sleep(0.5)
        for beat in beats:
            beat.send_signal(signal.SIGTERM)
            beat.wait(timeout=15)
        lags = _lags(database_url)
    finally:
        for beat in beats:
            if beat.poll() is None:
                beat.kill()
        release_redis_db(base, db, owner)
        drop_test_database(admin, name)
    return {
        "fires": len(lags),
        "schedules": schedules,
        "replicas": replicas,
        "p50_s": round(statistics.median(lags), 3),
        "p99_s": round(_percentile(lags, 0.99), 3),
        "max_s": round(lags[-1], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fires", type=int, default=200)
    parser.add_argument("--schedules", type=int, default=4)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(args.fires, args.schedules, args.replicas)
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"{result['fires']} fires of {result['schedules']} schedules, "
            f"{result['replicas']} beat replica(s): p50 {result['p50_s']}s, "
            f"p99 {result['p99_s']}s, max {result['max_s']}s"
        )


if __name__ == "__main__":
    main()
