"""What a worker takes is noted as held by it, and a live peer gives a dead worker's messages
back to their queue once, never a live worker's."""

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from service.platform.constants import WORKERS_KEY
from service.platform.settings import Settings
from tasks import liveness
from tasks.liveness import Liveness, held_key
from tests.conftest import Stack


@pytest.fixture
def app(stack: Stack) -> Celery:
    from tasks.app import create_celery  # builds the process-wide app: only once stack is up

    return create_celery(Settings(broker_url=stack.broker_url))


@pytest.fixture
def broker(stack: Stack) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(stack.broker_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def queue(broker: redis.Redis) -> Iterator[str]:
    name = f"liveness-test-{uuid.uuid4().hex[:8]}"
    yield name
    broker.delete(name)


def _worker() -> str:
    return f"test@host:{uuid.uuid4().hex[:8]}"


class Taker:
    """Takes messages as a worker's consumer does, unacknowledged, on connections left open
    until the test ends and then dropped as a killed worker drops them: nothing given back."""

    def __init__(self, app: Celery, queue: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.app, self.queue, self.monkeypatch = app, queue, monkeypatch
        self.connections: list[Any] = []

    def take(self, worker: str, count: int = 1) -> list[str]:
        self.monkeypatch.setattr(liveness, "_holder", held_key(worker))
        connection = self.app.connection_for_write()
        self.connections.append(connection)
        channel: Any = connection.default_channel
        producer = connection.Producer(serializer="json")
        declare = [connection.SimpleQueue(self.queue).queue]
        tags = []
        for n in range(count):
            producer.publish({"n": n}, routing_key=self.queue, declare=declare)
            message = channel.basic_get(self.queue, no_ack=False)
            assert message is not None
            tags.append(message.delivery_tag)
        self.monkeypatch.setattr(liveness, "_holder", None)
        return tags

    def drop(self) -> None:
        for connection in self.connections:
            connection.default_channel.qos.restore_at_shutdown = False
            connection.release()


@pytest.fixture
def taker(app: Celery, queue: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Taker]:
    made = Taker(app, queue, monkeypatch)
    yield made
    made.drop()


def _beat(broker: redis.Redis, worker: str, at: float) -> None:
    broker.zadd(WORKERS_KEY, {worker: at})


def _liveness(app: Celery, broker: redis.Redis) -> Liveness:
    return Liveness(app, broker, _worker(), interval_s=1.0, dead_after_s=3.0)


def test_a_message_taken_is_held_by_its_worker_until_acknowledged(
    app: Celery, broker: redis.Redis, queue: str, taker: Taker
) -> None:
    worker = _worker()
    (tag,) = taker.take(worker)
    assert broker.smembers(held_key(worker)) == {tag}
    assert broker.hexists("unacked", tag)

    taker.monkeypatch.setattr(liveness, "_holder", held_key(worker))
    taker.connections[0].default_channel.qos.ack(tag)
    assert broker.smembers(held_key(worker)) == set()
    assert not broker.hexists("unacked", tag)


def test_a_dead_workers_messages_go_back_to_the_head_of_their_queue(
    app: Celery, broker: redis.Redis, queue: str, taker: Taker
) -> None:
    dead = _worker()
    tags = taker.take(dead, count=3)
    now = time.time()
    _beat(broker, dead, now - 60)

    assert _liveness(app, broker).reap(dead, now - 3) == 3
    assert broker.llen(queue) == 3
    assert not any(broker.hexists("unacked", tag) for tag in tags)
    assert not broker.exists(held_key(dead))
    assert broker.zscore(WORKERS_KEY, dead) is None


def test_a_live_workers_messages_stay_its_own(
    app: Celery, broker: redis.Redis, queue: str, taker: Taker
) -> None:
    busy = _worker()
    (tag,) = taker.take(busy)
    now = time.time()
    _beat(broker, busy, now)

    assert _liveness(app, broker).reap(busy, now - 3) == 0
    assert broker.llen(queue) == 0
    assert broker.hexists("unacked", tag)
    assert broker.smembers(held_key(busy)) == {tag}
    broker.zrem(WORKERS_KEY, busy)


def test_two_peers_reaping_the_same_worker_restore_each_message_once(
    app: Celery, broker: redis.Redis, queue: str, taker: Taker
) -> None:
    dead = _worker()
    tags = taker.take(dead, count=2)
    now = time.time()
    _beat(broker, dead, now - 60)

    assert liveness.restore(app, tags) == 2
    assert _liveness(app, broker).reap(dead, now - 3) == 0
    assert broker.llen(queue) == 2


def test_a_worker_that_beats_again_while_reaped_is_not_forgotten(
    app: Celery, broker: redis.Redis, queue: str, taker: Taker
) -> None:
    """Cut off, then back: what it held ran elsewhere, and it keeps its place and its set."""
    back = _worker()
    taker.take(back)
    now = time.time()
    _beat(broker, back, now - 60)
    peer = _liveness(app, broker)
    real_restore = liveness.restore

    def restore_while_it_beats(app: Celery, tags: list[str]) -> int:
        _beat(broker, back, now)
        return real_restore(app, tags)

    taker.monkeypatch.setattr(liveness, "restore", restore_while_it_beats)
    assert peer.reap(back, now - 3) == 1
    assert broker.zscore(WORKERS_KEY, back) == now
    assert broker.exists(held_key(back))
    broker.zrem(WORKERS_KEY, back)
    broker.delete(held_key(back))


def test_a_stopped_worker_is_marked_for_its_peers_at_once(app: Celery, broker: redis.Redis) -> None:
    stopping = _liveness(app, broker)
    stopping.start()
    assert broker.zscore(WORKERS_KEY, stopping.worker) is not None
    stopping.stop()
    assert broker.zscore(WORKERS_KEY, stopping.worker) == 0
    broker.zrem(WORKERS_KEY, stopping.worker)
