"""The sweep task behind a backlog: what it sends again waits in the steps queue like any other
message, and the passes after it leave it there instead of sending it once more each (the
full-scale worker-kill scenario found the queue growing by every waiting compensation at every
pass, 52,000 messages for 2,000 jobs)."""

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
import redis
from celery import Celery
from kombu.connection import Connection
from sqlalchemy import update

from service.engine.runner import run_step
from service.engine.runtime import Runtime
from service.engine.steps import StepKey
from service.engine.submission import mark_dispatched
from service.platform.clock import utcnow
from service.platform.constants import BROKER_EPOCH_KEY, QUEUE_STEPS, TASK_RUN_STEP
from service.platform.db import unit_of_work
from service.platform.models import CompensationRow
from service.platform.settings import get_settings
from tasks.transport import message_router, transport_for
from tests.conftest import Stack
from tests.support.fanouts import submitted
from tests.support.servers import allocate_redis_db, redis_base_url, release_redis_db

pytestmark = pytest.mark.e2e  # runs sweeper passes in a process of their own

SAGA = {
    "name": "backlogged-saga",
    "steps": [
        {
            "id": "book",
            "action": "noop",
            "compensate": {"action": "drill.undo", "with": {"name": "unbook"}},
        },
        {
            "id": "charge",
            "action": "fail",
            "depends_on": ["book"],
            "with": {"message": "card declined", "retryable": False},
        },
    ],
}
THREE_PASSES = """
import sys, time
from tasks.sweep import sweep
sweep()
sweep()
time.sleep(float(sys.argv[1]) + 0.5)
sweep()
"""
"""Two passes at once, the third once the grace a message has to arrive is over."""


@pytest.fixture
def rt(stack: Stack) -> Iterator[Runtime]:
    runtime = Runtime.start(get_settings())
    yield runtime
    runtime.sessions.kw["bind"].dispose()


@pytest.fixture
def unconsumed_broker(stack: Stack) -> Iterator[str]:
    """A Redis DB of its own, whose queue no worker of the suite consumes, marked as a broker
    that has not lost its messages."""
    owner = f"sweep-test-{uuid.uuid4().hex[:8]}"
    base = redis_base_url()
    number = allocate_redis_db(base, owner)
    url = f"{stack.broker_url.rsplit('/', 1)[0]}/{number}"
    client = redis.Redis.from_url(url)
    client.set(BROKER_EPOCH_KEY, "set by the test")
    client.close()
    yield url
    release_redis_db(base, number, owner)


def _queued_for(broker_url: str, job_id: uuid.UUID) -> int:
    broker = redis.Redis.from_url(broker_url)
    try:
        messages = [json.loads(raw) for raw in broker.lrange(QUEUE_STEPS, 0, -1)]
    finally:
        broker.close()
    return sum(str(job_id) in message["headers"].get("argsrepr", "") for message in messages)


def test_a_lost_compensation_is_sent_once_however_many_passes_find_it_still_queued(
    rt: Runtime, unconsumed_broker: str
) -> None:
    job_id = submitted(rt, SAGA, {})
    for step_id in ("book", "charge"):
        run_step(rt, StepKey(job_id, step_id), task_id=uuid.uuid4().hex)
    with unit_of_work(rt.sessions) as session:
        session.execute(
            update(CompensationRow)
            .where(CompensationRow.job_id == job_id)
            .values(due_at=utcnow() - timedelta(minutes=5))
        )

    subprocess.run(
        [sys.executable, "-c", THREE_PASSES, str(rt.settings.dispatch_grace_s)],
        env={**os.environ, "FLOWBEAT_BROKER_URL": unconsumed_broker},
        check=True,
        timeout=60,
    )

    assert _queued_for(unconsumed_broker, job_id) == 1


ONE_PASS = "from tasks.sweep import sweep; sweep()"


def test_a_job_whose_message_was_lost_in_flight_is_sent_again_and_one_a_worker_holds_is_not(
    rt: Runtime, unconsumed_broker: str
) -> None:
    """Neither job has done anything for far longer than the grace and far less than the
    stall sweep's wait; the broker shows one held by a worker and the other nowhere."""
    lost, held = submitted(rt, SAGA, {}), submitted(rt, SAGA, {})
    with unit_of_work(rt.sessions) as session:
        for job_id in (lost, held):
            mark_dispatched(session, job_id, utcnow() - timedelta(seconds=60))
    app = Celery("lost-in-flight", broker=unconsumed_broker, set_as_current=False)
    app.conf.task_routes = (message_router(unconsumed_broker, QUEUE_STEPS),)
    app.send_task(TASK_RUN_STEP, args=[str(held), "book"], ignore_result=True)
    with Connection(  # type: ignore[no-untyped-call]  # kombu's __init__ is unannotated
        unconsumed_broker, transport=transport_for(unconsumed_broker)
    ) as conn:
        taken = conn.SimpleQueue(QUEUE_STEPS).get(timeout=5)
        subprocess.run(
            [sys.executable, "-c", ONE_PASS],
            env={
                **os.environ,
                "FLOWBEAT_BROKER_URL": unconsumed_broker,
                "FLOWBEAT_STALL_AFTER_S": "3600",
            },
            check=True,
            timeout=60,
        )
        taken.ack()
    app.close()

    assert _queued_for(unconsumed_broker, lost) == 1
    assert _queued_for(unconsumed_broker, held) == 0
