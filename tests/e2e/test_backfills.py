"""Backfills on real workers and beat replicas, made and read through the flowbeat command: the
beat leader SIGKILLed halfway skips and doubles no fire time, never more than ``max_active``
jobs open, each job reading the period its fire covers; a cancel ends the open jobs."""

import json
import subprocess
import sys
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from scheduler.lock import inspect
from service.catalogue.saving import save_pipeline
from service.engine.submission import resolve_request
from service.language.cron import ScheduleSpec, Timing
from service.platform.clock import utcnow
from service.platform.constants import BEAT_LOCK_KEY
from service.platform.db import unit_of_work
from service.platform.models import JobRow
from service.triggers.backfills import BackfillRange, fires_in
from service.triggers.schedules import put_schedule
from tests.e2e.conftest import FINAL, ROOT, Client, Cluster, Proc, wait_for

LOCK_TTL_S = 3
CRON = "0 */2 * * *"
ZONE = "Asia/Kolkata"
"""Half an hour off UTC, so a fire read in the wrong zone is off by a visible amount."""
PERIOD = {"since": "${{ schedule.previous_fire_time }}", "until": "${{ schedule.fire_time }}"}
"""What a step of a literature search reads to cover its fire's period."""


def _pipeline(client: Client, owner: str, hold_s: float) -> None:
    """A saved pipeline whose one step holds ``hold_s`` and returns the period it read, with a
    paused cron schedule to backfill."""
    profile = {
        "name": "period",
        "steps": [
            {
                "id": "cover",
                "action": "drill.count",
                "with": {"name": "cover", "value": PERIOD, "hold_s": hold_s},
            }
        ],
    }
    with unit_of_work(client.rt.sessions) as session:
        save_pipeline(
            session,
            owner=owner,
            name=None,
            body=profile,
            settings=client.settings,
            known_actions=client.rt.registry.names(),
        )
    _schedule(client, owner, cron=CRON, timezone=ZONE, enabled=False)


def _schedule(client: Client, owner: str, **spec: Any) -> None:
    settings = client.settings.model_copy(update={"schedule_min_interval_s": 1})
    with unit_of_work(client.rt.sessions) as session:
        profile = resolve_request(
            session,
            "period",
            owner=owner,
            profiles_dir=settings.profiles_dir,
            known_actions=client.rt.registry.names(),
        ).profile
        put_schedule(
            session,
            owner=owner,
            profile=profile,
            spec=ScheduleSpec.model_validate(spec),
            settings=settings,
            now=utcnow(),
        )


def _run(cluster: Cluster, *args: str) -> str:
    """The flowbeat command as a user runs it; its output, once it exited 0."""
    done = subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        env={**cluster.env, "COLUMNS": "200"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _flowbeat(cluster: Cluster, *args: str) -> Any:
    return json.loads(_run(cluster, *args, "--json"))


def _finished(cluster: Cluster, owner: str) -> dict[str, Any] | None:
    """The owner's one backfill as ``schedules backfills`` lists it, once it is over."""
    (listed,) = _flowbeat(cluster, "schedules", "backfills", "period", "--owner", owner)[
        "backfills"
    ]
    return listed if listed["status"] != "running" else None


def _jobs(client: Client, owner: str) -> list[tuple[datetime, uuid.UUID, str]]:
    with unit_of_work(client.rt.sessions) as session:
        rows = session.execute(
            select(JobRow.scheduled_for, JobRow.id, JobRow.status)
            .where(JobRow.owner == owner)
            .order_by(JobRow.scheduled_for)
        ).all()
    return [(fire, job_id, status) for fire, job_id, status in rows if fire is not None]


def _leader(client: Client, beats: list[Proc]) -> Proc | None:
    holder = inspect(client.broker, BEAT_LOCK_KEY).holder
    if holder is None:
        return None
    pid = int(holder.split(":")[-2])
    return next((b for b in beats if b.popen.pid == pid and b.popen.poll() is None), None)


def _range(hours: int) -> BackfillRange:
    end = utcnow().replace(minute=0, second=0, microsecond=0)
    return BackfillRange(end - timedelta(hours=hours), end, 2)


@pytest.mark.drill
@pytest.mark.timeout(180)
def test_a_backfill_survives_a_beat_leader_kill_without_skipping_or_doubling_a_fire(
    client: Client, cluster: Cluster
) -> None:
    owner = f"backfill-{uuid.uuid4().hex[:6]}"
    _pipeline(client, owner, hold_s=1.0)
    cluster.worker(concurrency=4)
    beats = [cluster.beat(beat_lock_ttl_s=str(LOCK_TTL_S)) for _ in range(2)]
    span = _range(24)
    expected = fires_in(Timing(CRON, None, ZONE), span, 100)
    assert len(expected) == 12

    made = _flowbeat(
        cluster,
        "schedules",
        "backfill",
        "period",
        "--from",
        span.start.isoformat(),
        "--to",
        span.end.isoformat(),
        "--max-active",
        "2",
        "--owner",
        owner,
    )["backfill"]
    assert (made["total"], made["status"]) == (12, "running")
    most_open = 0

    def started_at_least(n: int) -> bool:
        nonlocal most_open
        jobs = _jobs(client, owner)
        most_open = max(most_open, sum(status not in FINAL for *_, status in jobs))
        return len(jobs) >= n

    wait_for(lambda: started_at_least(6), 60, "half the fires to start")
    leader = wait_for(lambda: _leader(client, beats), 10, "a leader")
    leader.kill()
    assert len(_jobs(client, owner)) < len(expected), "the leader was killed too late"
    beats.append(cluster.beat(beat_lock_ttl_s=str(LOCK_TTL_S)))
    wait_for(lambda: started_at_least(12), 60, "the rest under the next leader")
    listed = wait_for(lambda: _finished(cluster, owner), 60, "the backfill to complete")

    jobs = _jobs(client, owner)
    assert [fire for fire, *_ in jobs] == expected, "a fire skipped or doubled"
    assert {status for *_, status in jobs} == {"succeeded"}
    assert most_open <= 2, f"{most_open} jobs open at once"
    for fire, job_id, _ in jobs:
        assert _period(client, job_id) == (fire - timedelta(hours=2), fire)
        assert client.count(job_id, "cover", "started") == 1
    assert listed["status"] == "completed"
    assert (listed["started"], listed["pending"], listed["jobs"]) == (12, 0, {"succeeded": 12})


def test_a_cancelled_backfill_cancels_its_open_jobs_and_starts_no_more(
    client: Client, cluster: Cluster
) -> None:
    owner = f"backfill-{uuid.uuid4().hex[:6]}"
    _pipeline(client, owner, hold_s=60.0)
    cluster.worker(concurrency=2)
    cluster.beat()
    span = _range(12)
    made = _flowbeat(
        cluster,
        "schedules",
        "backfill",
        "period",
        "--from",
        span.start.isoformat(),
        "--to",
        span.end.isoformat(),
        "--max-active",
        "2",
        "--owner",
        owner,
    )["backfill"]
    wait_for(
        lambda: [s for *_, s in _jobs(client, owner)] == ["running", "running"],
        30,
        "two jobs running",
    )

    said = _run(cluster, "schedules", "backfill-cancel", "period", made["id"], "--owner", owner)

    assert "2 open jobs cancelled" in said
    wait_for(
        lambda: [s for *_, s in _jobs(client, owner)] == ["cancelled", "cancelled"],
        30,
        "the open jobs cancelled",
    )
    shown = _flowbeat(cluster, "schedules", "backfills", "period", made["id"], "--owner", owner)
    assert shown["backfill"]["status"] == "cancelled"
    assert shown["backfill"]["pending"] == 4
    assert [fire["status"] for fire in shown["backfill"]["fires"]] == ["cancelled", "cancelled"]


def test_an_ordinary_fire_reads_the_period_it_covers(client: Client, cluster: Cluster) -> None:
    owner = f"fire-{uuid.uuid4().hex[:6]}"
    _pipeline(client, owner, hold_s=0.0)
    _schedule(client, owner, every="1s")
    cluster.worker()
    cluster.beat()

    fire, job_id, _ = wait_for(lambda: next(iter(_jobs(client, owner)), None), 20, "a fire")
    client.wait_final(job_id)
    _schedule(client, owner, every="1s", enabled=False)

    assert _period(client, job_id) == (fire - timedelta(seconds=1), fire)


def _period(client: Client, job_id: uuid.UUID) -> tuple[datetime, datetime]:
    """The period the job's step read: from the schedule's fire before to the job's fire."""
    value = client.view(job_id).job.result["cover"]["value"]
    return datetime.fromisoformat(value["since"]), datetime.fromisoformat(value["until"])
