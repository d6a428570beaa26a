"""Each queue and priority is a Redis list of its own: a worker of a queue takes the highest
priority first, a job's messages go to their steps' queues at its priority, and what waits in
each queue, since when and for whom is read back from the broker."""

import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from celery import Celery
from kombu.connection import Connection

from service.language.plan import JobPlan, StepPlan
from service.platform.constants import QUEUE_STEPS, TASK_RUN_STEP, WORKER_QUEUES_KEY, WORKERS_KEY
from service.platform.settings import Settings
from tasks.broker import next_jobs, queue_states, waiting_since
from tasks.messages import plan_messages, push
from tasks.queues import (
    broker_level,
    priority_of,
    queue_lists,
    queue_name,
    queue_of,
    route_of,
    step_list,
)
from tasks.transport import transport_for
from tests.conftest import Stack


@pytest.fixture
def broker(stack: Stack) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(stack.broker_url)
    yield client
    client.close()


@pytest.fixture
def queue(broker: redis.Redis) -> Iterator[str]:
    """A queue of this test's own, whose lists are deleted after it."""
    name = f"q{uuid.uuid4().hex[:8]}"
    yield name
    broker.delete(*queue_lists(queue_name(name)))


@pytest.fixture
def app(stack: Stack) -> Iterator[Celery]:
    from tasks.app import create_celery  # builds the process-wide app: only once stack is up

    celery = create_celery(Settings(broker_url=stack.broker_url))
    yield celery
    celery.close()


def test_the_default_queue_at_the_default_priority_is_the_steps_list_it_always_was() -> None:
    assert step_list("default", 0) == QUEUE_STEPS
    assert step_list("gpu", 0) == "flowbeat.steps.gpu"
    assert step_list("gpu", 9) != step_list("gpu", 8) != step_list("gpu", 0)


def test_every_list_names_its_queue_and_priority_and_no_other_key_does() -> None:
    for queue in ("default", "gpu", "big-mem"):
        for priority in range(10):
            assert route_of(step_list(queue, priority)) == (queue, priority)
    assert route_of("flowbeat.control") is None
    assert route_of("unacked") is None
    assert queue_of("flowbeat.stepsx") is None


def test_a_priority_survives_the_trip_through_kombus_levels() -> None:
    assert [priority_of(broker_level(p)) for p in range(10)] == list(range(10))
    assert priority_of(None) == 0
    assert priority_of(0) == 0, "kombu's 'none given'"


def test_a_plans_messages_go_to_their_steps_queues_at_the_jobs_priority(
    app: Celery, broker: redis.Redis, queue: str
) -> None:
    job = uuid.uuid4()
    plan = JobPlan(job, [StepPlan("a", 30, queue=queue), StepPlan("b", 30)], priority=7)
    messages = plan_messages(app, plan)

    assert [key for key, _ in messages] == [step_list(queue, 7), step_list("default", 7)]
    push(str(app.conf.broker_write_url), messages[:1])
    assert broker.llen(step_list(queue, 7)) == 1


def test_a_worker_of_a_queue_takes_the_highest_priority_first(
    app: Celery, stack: Stack, queue: str
) -> None:
    """The same path for a message pushed here and one Celery publishes."""
    for priority in (0, 9, 4):
        plan = JobPlan(uuid.uuid4(), [StepPlan(f"p{priority}", 30, queue=queue)], priority=priority)
        push(stack.broker_url, plan_messages(app, plan))
    app.send_task(
        TASK_RUN_STEP,
        args=[str(uuid.uuid4()), "p6"],
        queue=queue_name(queue),
        priority=broker_level(6),
    )

    taken = []
    with Connection(  # type: ignore[no-untyped-call]  # kombu's __init__ is unannotated
        stack.broker_url, transport=transport_for(stack.broker_url)
    ) as conn:
        simple = conn.SimpleQueue(queue_name(queue))
        for _ in range(4):
            message = simple.get(timeout=5)
            taken.append(message.payload[0][1])
            message.ack()
    assert taken == ["p9", "p6", "p4", "p0"]


def test_what_waits_in_each_queue_since_when_and_who_consumes_it(
    app: Celery, broker: redis.Redis, queue: str
) -> None:
    before = time.time()
    for priority in (0, 0, 5):
        plan = JobPlan(uuid.uuid4(), [StepPlan("a", 30, queue=queue)], priority=priority)
        push(str(app.conf.broker_write_url), plan_messages(app, plan))
    worker = f"test@{uuid.uuid4().hex[:6]}"
    seconds, micros = broker.time()
    broker.zadd(WORKERS_KEY, {worker: seconds + micros / 1e6})
    broker.hset(WORKER_QUEUES_KEY, worker, f"{queue_name(queue)},flowbeat.control")
    try:
        states = {state.name: state for state in queue_states(broker, dead_after_s=15)}
    finally:
        broker.zrem(WORKERS_KEY, worker)
        broker.hdel(WORKER_QUEUES_KEY, worker)

    mine = states[queue]
    assert (mine.depth, mine.by_priority, mine.workers) == (3, {5: 1, 0: 2}, [worker])
    assert mine.oldest_sent is not None and mine.oldest_sent.timestamp() >= before - 1
    assert "default" in states, "the default queue is always listed"
    assert waiting_since(broker)[(queue, 0)] == mine.oldest_sent


def test_a_queue_that_a_dead_worker_consumed_is_listed_without_it(
    broker: redis.Redis, queue: str
) -> None:
    worker = f"test@{uuid.uuid4().hex[:6]}"
    broker.zadd(WORKERS_KEY, {worker: 1.0})
    broker.hset(WORKER_QUEUES_KEY, worker, queue_name(queue))
    try:
        states = {state.name: state for state in queue_states(broker, dead_after_s=15)}
    finally:
        broker.zrem(WORKERS_KEY, worker)
        broker.hdel(WORKER_QUEUES_KEY, worker)
    assert queue not in states


def test_the_job_of_each_lists_next_message_is_known_queued(
    app: Celery, broker: redis.Redis, queue: str
) -> None:
    """However long it has waited: a pool with no worker yet keeps its message there."""
    first, second = uuid.uuid4(), uuid.uuid4()
    for job in (first, second):
        push(
            str(app.conf.broker_write_url),
            plan_messages(app, JobPlan(job, [StepPlan("a", 30, queue=queue)])),
        )

    assert first in next_jobs(broker)
    assert second not in next_jobs(broker), "behind the first: the sweeper's FIFO test covers it"
