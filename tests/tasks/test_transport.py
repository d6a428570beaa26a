"""The broker transport publishes through one client per pool instead of one per message, and
a worker's connection torn down after Redis vanished fails only as a lost connection."""

import contextlib
import time
import uuid
from typing import Any

import redis
from kombu.connection import Connection
from kombu.entity import Exchange, Queue
from sqlalchemy import make_url

from service.platform.constants import QUEUE_CONTROL, QUEUE_STEPS, TASK_SWEEP
from service.platform.settings import Settings
from tasks.transport import Transport, message_router, transport_for
from tests.conftest import Stack
from tests.support.tcpproxy import TcpProxy


def test_a_plain_redis_broker_gets_the_shared_client_transport() -> None:
    assert transport_for("redis://127.0.0.1:6379/3") == "tasks.transport:Transport"


def test_a_sentinel_broker_gets_its_flavour_with_the_same_priorities_and_liveness() -> None:
    from kombu.transport import redis as kombu_redis

    from tasks.transport import Channel, SentinelTransport

    url = "sentinel://127.0.0.1:26379;sentinel://127.0.0.1:26380"
    assert transport_for(url) == "tasks.transport:SentinelTransport"
    channel = SentinelTransport.Channel
    assert issubclass(channel, Channel) and issubclass(channel, kombu_redis.SentinelChannel)
    assert channel.QoS is Channel.QoS and channel._q_for_pri is Channel._q_for_pri
    assert channel._get_pool is kombu_redis.SentinelChannel._get_pool


def test_other_brokers_keep_kombus_own_choice() -> None:
    for url in ("rediss://example:6380/0", "redis+socket:///tmp/redis.sock", "amqp://x", None):
        assert transport_for(url) is None


def test_the_celery_app_connects_through_it(stack: Stack) -> None:
    from tasks.app import create_celery  # builds the process-wide app: only once stack is up

    app = create_celery(Settings(broker_url=stack.broker_url))
    with app.connection_for_write() as conn:
        assert isinstance(conn.transport, Transport)


def test_publishes_share_one_client_until_the_pool_is_replaced(stack: Stack) -> None:
    queue = f"transport-test-{uuid.uuid4().hex[:8]}"
    with Connection(  # type: ignore[no-untyped-call]  # kombu's __init__ is unannotated
        stack.broker_url, transport=transport_for(stack.broker_url)
    ) as conn:
        channel = conn.default_channel
        with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
            assert first is second
        producer = conn.Producer(serializer="json")
        for n in range(3):
            producer.publish({"n": n}, routing_key=queue, declare=[conn.SimpleQueue(queue).queue])
        channel._disconnect_pools()  # what kombu does after a fork
        with channel.conn_or_acquire() as third:
            assert third is not first
        producer.publish({"n": 3}, routing_key=queue)

    client = redis.Redis.from_url(stack.broker_url)
    try:
        assert client.llen(queue) == 4
    finally:
        client.delete(queue)
        client.close()


def test_messages_skip_declaring_their_queue_on_redis_only() -> None:
    redis_urls = ["redis://127.0.0.1:6379/3", "rediss://example:6380/0", "redis+socket:///r.sock"]
    for redis_url in redis_urls:
        assert message_router(redis_url, "q")("t", (), {}, {})["declare"] == []
    for other in ("amqp://guest@localhost//", "memory://", None):
        assert "declare" not in message_router(other, "q")("t", (), {}, {})


def test_messages_go_to_the_queue_given_with_their_arguments_shown_as_plain_repr() -> None:
    route = message_router("redis://127.0.0.1:6379/3", "flowbeat.steps")
    options = route("flowbeat.run_step", ["job", "step"], None, {})
    assert options["queue"] == "flowbeat.steps"
    assert options["argsrepr"] == "('job', 'step')"
    assert options["kwargsrepr"] == "{}"


def test_tasks_named_elsewhere_go_to_their_own_queue() -> None:
    route = message_router(None, "flowbeat.steps", {"flowbeat.sweep": "flowbeat.control"})
    assert route("flowbeat.sweep", (), {}, {})["queue"] == "flowbeat.control"
    assert route("flowbeat.run_step", (), {}, {})["queue"] == "flowbeat.steps"


def test_arguments_too_long_to_show_are_left_to_celery_to_truncate() -> None:
    options = message_router(None, "q")("t", ["x" * 2000], {"k": "y" * 2000}, {})
    assert options["argsrepr"] is None
    assert options["kwargsrepr"] is None


def test_the_celery_app_routes_every_message_through_it(stack: Stack) -> None:
    from tasks.app import create_celery  # builds the process-wide app: only once stack is up

    app = create_celery(Settings(broker_url=stack.broker_url))
    options = app.amqp.router.route({}, "flowbeat.run_step", ("job", "step"), {})
    assert options["declare"] == []
    assert options["argsrepr"] == "('job', 'step')"
    assert options["queue"].name == QUEUE_STEPS
    assert app.amqp.router.route({}, TASK_SWEEP, (), {})["queue"].name == QUEUE_CONTROL
    assert set(app.amqp.queues) == {QUEUE_STEPS, QUEUE_CONTROL}, "what a worker consumes"


def test_a_message_sent_without_declaring_reaches_a_queue_whose_bindings_were_flushed(
    stack: Stack,
) -> None:
    queue = f"transport-test-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(stack.broker_url)
    with Connection(  # type: ignore[no-untyped-call]  # kombu's __init__ is unannotated
        stack.broker_url, transport=transport_for(stack.broker_url)
    ) as conn:
        conn.SimpleQueue(queue).queue.declare()
        assert client.delete(f"_kombu.binding.{queue}") == 1
        conn.Producer(serializer="json").publish(
            {"n": 1}, exchange="", routing_key=queue, declare=[]
        )
    try:
        assert client.llen(queue) == 1
    finally:
        client.delete(queue)
        client.close()


def test_a_connection_torn_down_after_redis_vanished_mid_wait_fails_only_as_a_lost_connection(
    stack: Stack,
) -> None:
    """As a worker holds it: a step's message taken and not yet acknowledged, the steps
    channel waiting on BRPOP, a second channel on a fan-out queue as remote control has. Redis
    goes away; Celery's consumer then collects the connection and closes it, ignoring only
    connection and channel errors: anything else stops the worker for good."""
    broker = make_url(stack.broker_url)
    name = f"transport-test-{uuid.uuid4().hex[:8]}"
    taken: list[Any] = []
    with TcpProxy(broker.host or "127.0.0.1", broker.port or 6379) as proxy:
        through = f"redis://127.0.0.1:{proxy.port}/{broker.database}"
        conn: Any = Connection(through, transport=transport_for(through))  # type: ignore[no-untyped-call]
        steps = _queue(name, "direct")
        conn.Producer(serializer="json").publish(
            {"step": "a"}, exchange=steps.exchange, routing_key=name, declare=[steps]
        )
        conn.Consumer(
            queues=[steps], callbacks=[lambda _, message: taken.append(message)]
        ).consume()
        control = _queue(f"{name}.control", "fanout", auto_delete=True)
        conn.Consumer(queues=[control], channel=conn.channel(), no_ack=True).consume()
        deadline = time.monotonic() + 10
        while not taken and time.monotonic() < deadline:
            _drain(conn)
        assert taken, "the message never arrived"
        _drain(conn)
        assert conn.default_channel._in_poll, "the steps channel is not waiting on BRPOP"

        proxy.cut()
        conn.collect()
        with contextlib.suppress(*conn.connection_errors, *conn.channel_errors):
            conn.close()

    client = redis.Redis.from_url(stack.broker_url)
    try:
        client.hdel("unacked", taken[0].delivery_tag)
        client.zrem("unacked_index", taken[0].delivery_tag)
        client.delete(name, f"_kombu.binding.{name}", f"_kombu.binding.{name}.control")
    finally:
        client.close()


def _queue(name: str, kind: str, **options: Any) -> Any:
    exchange = Exchange(name, type=kind)  # type: ignore[no-untyped-call]  # kombu is unannotated
    return Queue(name, exchange, routing_key=name, **options)  # type: ignore[no-untyped-call]


def _drain(conn: Any) -> None:
    with contextlib.suppress(TimeoutError):
        conn.drain_events(timeout=0.2)
