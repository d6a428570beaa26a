"""The result backend holds nothing for the results of a fan-out that nobody waits on."""

import gc
import uuid
from collections.abc import Iterator

import pytest
import redis
from celery import Celery
from celery.result import AsyncResult

from service.engine.steps import StepKey
from tasks.backend import backend_url
from tasks.canvas import fan_out
from tasks.transport import message_router
from tests.conftest import Stack

FAN_OUTS = 20
LANES = 2


@pytest.fixture
def app(stack: Stack) -> Iterator[Celery]:
    app = Celery(
        "backend-test",
        broker=stack.broker_url,
        backend=backend_url(stack.broker_url),
        set_as_current=False,
    )
    queue = f"backend-test-{uuid.uuid4().hex[:8]}"
    app.conf.task_routes = (message_router(stack.broker_url, queue),)
    yield app
    client = redis.Redis.from_url(stack.broker_url)
    client.delete(queue)
    client.close()
    app.close()


def _send_fan_out(app: Celery) -> set[str]:
    """What ``Task.replace`` does with a fan-out in a worker: freeze it, then send it. Returns
    the ids of its lanes."""
    signature = fan_out(app, StepKey(uuid.uuid4(), "b"), LANES, 30, "pipeline")
    signature.freeze()
    signature.apply_async()
    return {lane.id for lane in signature.tasks.tasks}


def test_the_lanes_of_a_sent_fan_out_are_neither_kept_nor_subscribed_to(
    app: Celery, stack: Stack
) -> None:
    lanes = {lane for _ in range(FAN_OUTS) for lane in _send_fan_out(app)}
    gc.collect()

    kept = [o for o in gc.get_objects() if isinstance(o, AsyncResult) and o.id in lanes]
    assert kept == []
    channels = [app.backend.get_key_for_task(lane).decode() for lane in lanes]
    client = redis.Redis.from_url(stack.broker_url)
    try:
        assert [name for name, count in client.pubsub_numsub(*channels) if count] == []
    finally:
        client.close()
