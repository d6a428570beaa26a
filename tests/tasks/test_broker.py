"""The sweeper reads from the broker how far behind the steps queue is."""

import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import redis
from celery import Celery

from service.platform.clock import utcnow
from service.platform.constants import (
    BROKER_EPOCH_KEY,
    QUEUE_STEPS,
    TASK_RUN_STEP,
    WORKER_QUEUES_KEY,
    WORKERS_KEY,
)
from service.platform.settings import Settings
from tasks import liveness
from tasks.broker import Taken, forget_loss, oldest_waiting, read_broker, worker_states
from tasks.liveness import held_key
from tasks.transport import message_router
from tests.conftest import Stack


@pytest.fixture
def broker(stack: Stack) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(stack.broker_url)
    yield client
    client.close()


def test_an_empty_queue_has_nothing_waiting(broker: redis.Redis) -> None:
    assert oldest_waiting(broker, f"sweep-test-{uuid.uuid4().hex[:8]}") is None


def test_the_next_message_to_go_tells_when_the_oldest_waiting_one_was_sent(
    stack: Stack, broker: redis.Redis
) -> None:
    queue = f"sweep-test-{uuid.uuid4().hex[:8]}"
    app = Celery("sweep-test", broker=stack.broker_url, set_as_current=False)
    app.conf.task_routes = (message_router(stack.broker_url, queue),)
    first_sent = time.time()
    app.send_task("flowbeat.test.first", ignore_result=True)
    time.sleep(0.05)
    second_sent = time.time()
    app.send_task("flowbeat.test.second", ignore_result=True)
    try:
        oldest = oldest_waiting(broker, queue)
        assert oldest is not None
        assert oldest.tzinfo is UTC
        assert abs(oldest.timestamp() - first_sent) < 0.05
        broker.rpop(queue)
        after_one_left = oldest_waiting(broker, queue)
        assert after_one_left is not None and after_one_left > oldest
        assert abs(after_one_left.timestamp() - second_sent) < 0.05
    finally:
        broker.delete(queue)
        app.close()


def test_a_message_without_a_readable_send_time_counts_as_sent_now(broker: redis.Redis) -> None:
    queue = f"sweep-test-{uuid.uuid4().hex[:8]}"
    broker.lpush(queue, b"not json")
    try:
        before = utcnow()
        oldest = oldest_waiting(broker, queue)
        assert oldest is not None and before <= oldest <= utcnow() + timedelta(seconds=1)
    finally:
        broker.delete(queue)


def test_a_loss_is_seen_once_unless_the_pass_that_saw_it_takes_it_back(stack: Stack) -> None:
    broker = redis.Redis.from_url(stack.broker_url)
    try:
        broker.delete(BROKER_EPOCH_KEY)
        first = read_broker(stack.broker_url)
        assert first.lost
        assert not read_broker(stack.broker_url).lost

        forget_loss(stack.broker_url, first.epoch)

        again = read_broker(stack.broker_url)
        assert again.lost
        forget_loss(stack.broker_url, first.epoch)
        assert not read_broker(stack.broker_url).lost, "another pass's marker stays"
    finally:
        broker.close()


def test_each_live_worker_is_listed_with_its_queues_and_the_steps_it_holds(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tasks.app import create_celery  # builds the process-wide app: only once stack is up

    app = create_celery(Settings(broker_url=stack.broker_url))
    client = redis.Redis.from_url(stack.broker_url)
    queue, job = f"workers-test-{uuid.uuid4().hex[:8]}", uuid.uuid4()
    busy, idle, dead = (f"test@host:{uuid.uuid4().hex[:8]}" for _ in range(3))
    now = float(client.time()[0])
    client.zadd(WORKERS_KEY, {busy: now, idle: now - 1, dead: now - 60})
    gpu = f"{QUEUE_STEPS},{QUEUE_STEPS}.gpu,celery.pidbox"
    client.hset(WORKER_QUEUES_KEY, mapping={busy: gpu, idle: QUEUE_STEPS, dead: QUEUE_STEPS})
    sent = app.send_task(TASK_RUN_STEP, args=[str(job), "fetch"], queue=queue, ignore_result=True)
    connection = app.connection_for_write()
    try:
        monkeypatch.setattr(liveness, "_holder", held_key(busy))
        taken = connection.default_channel.basic_get(queue, no_ack=False)
        client.sadd(held_key(busy), "acknowledged-meanwhile")

        workers = {w.name: w for w in worker_states(client, dead_after_s=30)}

        assert dead not in workers
        assert workers[busy].queues == ["default", "gpu"]
        assert workers[busy].taken == [Taken(TASK_RUN_STEP, sent.id, job, "fetch")]
        assert workers[busy].beat_at == datetime.fromtimestamp(now, UTC)
        assert (workers[idle].queues, workers[idle].taken) == (["default"], [])
    finally:
        connection.default_channel.qos.ack(taken.delivery_tag)
        connection.release()
        client.zrem(WORKERS_KEY, busy, idle, dead)
        client.hdel(WORKER_QUEUES_KEY, busy, idle, dead)
        client.delete(queue, held_key(busy))
        client.close()
        app.close()
