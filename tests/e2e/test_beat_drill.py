"""Three beat replicas, the leader SIGKILLed again and again: one job per fire, none missed.

Each killed replica is replaced by a fresh one, as a supervisor would, so three always run."""

import itertools
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
import redis
from sqlalchemy import select

from scheduler.lock import inspect
from service.language.cron import ScheduleSpec
from service.language.loading import find_profile
from service.platform.clock import utcnow
from service.platform.constants import BEAT_LOCK_KEY
from service.platform.db import unit_of_work
from service.platform.models import JobRow
from service.triggers.schedules import put_schedule
from tests.e2e.conftest import FINAL, Client, Cluster, Proc, wait_for

LOCK_TTL_S = 3
EVERY_S = 2
KILLS = 3


def _save(client: Client, owner: str = "drill", **spec: Any) -> None:
    settings = client.settings.model_copy(update={"schedule_min_interval_s": 1})
    profile = find_profile(settings.profiles_dir, "slow")
    with unit_of_work(client.rt.sessions) as session:
        put_schedule(
            session,
            owner=owner,
            profile=profile,
            spec=ScheduleSpec.model_validate(spec),
            settings=settings,
            now=utcnow(),
        )


def _jobs(client: Client, owner: str = "drill") -> list[tuple[datetime, datetime, str]]:
    with unit_of_work(client.rt.sessions) as session:
        rows = session.execute(
            select(JobRow.scheduled_for, JobRow.created_at, JobRow.status)
            .where(JobRow.owner == owner, JobRow.schedule_id.is_not(None))
            .order_by(JobRow.scheduled_for)
        ).all()
    jobs: list[tuple[datetime, datetime, str]] = []
    for fire, created, status in rows:
        assert fire is not None, "a scheduled job without its fire time"
        jobs.append((fire, created, status))
    return jobs


def _fired_at_least(client: Client, n: int, owner: str = "drill") -> Callable[[], bool]:
    return lambda: len(_jobs(client, owner)) >= n


def _leader(broker: redis.Redis, beats: list[Proc]) -> Proc | None:
    holder = inspect(broker, BEAT_LOCK_KEY).holder
    if holder is None:
        return None
    pid = int(holder.split(":")[-2])
    return next((b for b in beats if b.popen.pid == pid and b.popen.poll() is None), None)


@pytest.mark.drill
@pytest.mark.timeout(120)
def test_killing_the_beat_leader_neither_doubles_nor_misses_a_fire(
    client: Client, cluster: Cluster
) -> None:
    cluster.worker()
    beats = [cluster.beat(beat_lock_ttl_s=str(LOCK_TTL_S)) for _ in range(3)]
    _save(client, every=f"{EVERY_S}s", overlap="allow", params={"hold_s": 0})

    for _ in range(KILLS):
        fired = len(_jobs(client))
        wait_for(_fired_at_least(client, fired + 2), 20, "two fires under this leader")
        leader = wait_for(lambda: _leader(client.broker, beats), 10, "a leader")
        leader.kill()
        beats.append(cluster.beat(beat_lock_ttl_s=str(LOCK_TTL_S)))
        wait_for(lambda: _leader(client.broker, beats), 2 * LOCK_TTL_S + 2, "a standby taking over")
    fired = len(_jobs(client))
    wait_for(lambda: len(_jobs(client)) >= fired + 2, 20, "fires under the last leader")
    _save(client, every=f"{EVERY_S}s", enabled=False)
    wait_for(lambda: all(status in FINAL for *_, status in _jobs(client)), 30, "runs to finish")

    jobs = _jobs(client)
    fires = [fire for fire, _, _ in jobs]
    assert len(fires) == len(set(fires)), "a fire time got two jobs"
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(fires)]
    assert max(gaps) <= LOCK_TTL_S, f"missed fires: gaps {gaps}"
    lags = [created - fire for fire, created, _ in jobs]
    assert max(lags) <= timedelta(seconds=3 * LOCK_TTL_S), f"late fires: {lags}"
    assert {status for *_, status in jobs} == {"succeeded"}
    assert len(jobs) >= 2 * (KILLS + 1)


@pytest.mark.drill
def test_a_leader_stopped_cleanly_frees_the_lock_at_once(client: Client, cluster: Cluster) -> None:
    leader = cluster.beat(beat_lock_ttl_s="60")
    wait_for(lambda: _leader(client.broker, [leader]), 10, "the only replica to lead")

    leader.stop()

    assert inspect(client.broker, BEAT_LOCK_KEY).holder is None
    standby = cluster.beat(beat_lock_ttl_s="60")
    wait_for(lambda: _leader(client.broker, [standby]), 10, "a new replica to lead at once")


def test_a_schedule_saved_while_the_leader_sleeps_fires_within_a_second_or_so(
    client: Client, cluster: Cluster
) -> None:
    """With a 60 s lock the leader renews every 20 s; it still reads schedules every second."""
    leader = cluster.beat(beat_lock_ttl_s="60")
    wait_for(lambda: _leader(client.broker, [leader]), 10, "the only replica to lead")
    before = len(_jobs(client))

    _save(client, every="1s", overlap="allow", params={"hold_s": 0})
    wait_for(_fired_at_least(client, before + 3), 10, "three fires")

    lags = [(created - fire).total_seconds() for fire, created, _ in _jobs(client)[before:]]
    assert max(lags) < 2.5, lags
