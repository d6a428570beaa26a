"""What earlier tests of this test process left behind that a new worker or beat would act on.

The tests of one process share its database and its Redis DB. A test that starts a worker or a
beat of its own starts them on a clean slate: no step messages nobody ran, no lock of a beat
leader that was killed, no holdings of killed workers, and, where its beat sweeps, no open jobs
of earlier tests for the sweeper to send again ahead of its own, nor their alert rules.
"""

from typing import cast

import redis
from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session, sessionmaker

from service.engine.jobs import cancel_job
from service.platform.clock import utcnow
from service.platform.constants import (
    BEAT_LOCK_KEY,
    UNACKED_KEY,
    WORKER_HELD_KEY_PREFIX,
    WORKER_QUEUES_KEY,
    WORKERS_KEY,
)
from service.platform.db import unit_of_work
from service.platform.models import AlertRuleRow, BackfillRow, JobRow, ScheduleRow
from service.platform.states import JOB_FINAL
from tasks.queues import step_lists

UNACKED_INDEX_KEY = "unacked_index"
"""kombu's Redis transport's index of ``UNACKED_KEY`` by delivery time (its default name)."""
LIVE_WORKER_S = 10.0
"""A worker that beat this recently may be a live one of a module's own (``shared_worker``);
every test's workers beat every 2 s or faster."""


def forget_earlier_tests(broker: redis.Redis) -> None:
    """Clear what earlier tests of this process left in its broker DB that a new worker or
    beat would act on: step messages nobody ran, the lock of a beat leader that was killed,
    and the heartbeats, holdings and unacknowledged messages of killed workers (a new worker
    would reap them back into the queues, and the visibility timeout would restore them).
    Live workers, the broker's epoch and the side-effect counters (in DB 0) are kept."""
    seconds, micros = broker.time()
    cutoff = seconds + micros / 1e6 - LIVE_WORKER_S
    lists = step_lists(broker)
    if lists:
        broker.delete(*lists)
    broker.delete(BEAT_LOCK_KEY)
    for raw in cast(list[bytes], broker.zrangebyscore(WORKERS_KEY, "-inf", cutoff)):
        worker = raw.decode()
        held = f"{WORKER_HELD_KEY_PREFIX}{worker}"
        tags = cast(set[bytes], broker.smembers(held))
        with broker.pipeline() as pipe:
            if tags:
                pipe.hdel(UNACKED_KEY, *tags)
                pipe.zrem(UNACKED_INDEX_KEY, *tags)
            pipe.delete(held)
            pipe.hdel(WORKER_QUEUES_KEY, worker)
            pipe.zrem(WORKERS_KEY, worker)
            pipe.execute()


def end_earlier_work(sessions: sessionmaker[Session]) -> None:
    """Every job of the database that is not over cancelled, every schedule disabled, every
    running backfill cancelled (a beat would start its fires), and every alert rule deleted
    with its outbox (a beat would match them and a worker send them to receivers long gone)."""
    with unit_of_work(sessions) as session:
        open_ids = session.scalars(select(JobRow.id).where(JobRow.status.not_in(JOB_FINAL))).all()
        for job_id in open_ids:
            cancel_job(session, job_id, owner=None, now=utcnow())
        session.execute(update(ScheduleRow).where(ScheduleRow.enabled).values(enabled=False))
        session.execute(
            update(BackfillRow).where(BackfillRow.status == "running").values(status="cancelled")
        )
        session.execute(delete(AlertRuleRow))
