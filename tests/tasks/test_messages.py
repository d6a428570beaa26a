"""A plain step's message pushed without Celery is, field by field, the one kombu writes for
the same task through the app's own configuration (router, transport, queues)."""

import asyncio
import base64
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
from celery import Celery
from celery.signals import before_task_publish

from service.engine.runtime import Runtime
from service.language.plan import JobPlan, StepPlan
from service.platform.brokers import BrokerAddress
from service.platform.constants import (
    BROKER_PUBLISH_RETRIES,
    BROKER_PUSH_TIMEOUT_S,
    CHAIN_SLICE_S,
    HEADER_SENT_AT,
    QUEUE_STEPS,
    STEP_TIMEOUT_GRACE_S,
)
from service.platform.errors import BrokerUnavailable
from service.platform.settings import get_settings
from tasks.canvas import send_plan
from tasks.dispatch import publish_new_jobs_async, publish_plan
from tasks.messages import async_broker_client, direct_broker, plan_messages, push
from tests.conftest import Stack
from tests.support.servers import allocate_redis_db, redis_base_url, release_redis_db
from tests.support.tcpproxy import TcpProxy

JOB = uuid.uuid4()
CLOSED_PORT_REDIS = "redis://127.0.0.1:1/0"


@pytest.fixture
def broker_url(stack: Stack) -> Iterator[str]:
    """A Redis DB of its own, whose queues no worker of the suite consumes."""
    owner = f"messages-test-{uuid.uuid4().hex[:8]}"
    base = redis_base_url()
    number = allocate_redis_db(base, owner)
    yield f"{stack.broker_url.rsplit('/', 1)[0]}/{number}"
    release_redis_db(base, number, owner)


def _app(broker_url: str, monkeypatch: pytest.MonkeyPatch) -> Celery:
    from tasks import app as app_module  # builds the process-wide app: only once stack is up

    monkeypatch.setattr("tasks.runtime.configure", lambda _: None)
    return app_module.create_celery(get_settings().model_copy(update={"broker_url": broker_url}))


@pytest.fixture
def app(broker_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Celery]:
    """The flowbeat app as the API builds it, on ``broker_url``."""
    celery_app = _app(broker_url, monkeypatch)
    yield celery_app
    celery_app.close()


@pytest.fixture
def queue(broker_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(broker_url)
    yield client
    client.close()


def _next(queue: redis.Redis) -> dict[str, Any]:
    """The next message a worker would pop: the rightmost."""
    raw = queue.rpop(QUEUE_STEPS)
    assert isinstance(raw, bytes)
    document: dict[str, Any] = json.loads(raw)
    return document


def _fresh(message: dict[str, Any]) -> tuple[str, float, str]:
    """The parts that differ on every publish, checked for their shape: the task id (which is
    also the root id and the correlation id), the send time and the delivery tag."""
    headers, properties = message["headers"], message["properties"]
    task_id = headers["id"]
    assert uuid.UUID(task_id)
    assert headers["root_id"] == properties["correlation_id"] == task_id
    assert uuid.UUID(properties["delivery_tag"])
    return task_id, headers[HEADER_SENT_AT], properties["delivery_tag"]


def _same_but_fresh(ours: dict[str, Any], kombus: dict[str, Any]) -> None:
    """Every field compared on its own, in kombu's order, with the fresh ones left out."""
    assert list(ours) == list(kombus)
    for name in ("body", "content-encoding", "content-type"):
        assert ours[name] == kombus[name], name
    assert json.loads(base64.b64decode(ours["body"])) == json.loads(
        base64.b64decode(kombus["body"])
    )
    for part, fresh in (
        ("headers", {"id", "root_id", HEADER_SENT_AT}),
        ("properties", {"correlation_id", "delivery_tag"}),
    ):
        assert list(ours[part]) == list(kombus[part]), part
        for name, value in kombus[part].items():
            if name not in fresh:
                assert ours[part][name] == value, f"{part}.{name}"
    ours_id, ours_sent, ours_tag = _fresh(ours)
    kombus_id, kombus_sent, kombus_tag = _fresh(kombus)
    assert ours_id != kombus_id and ours_tag != kombus_tag
    assert abs(ours_sent - kombus_sent) < 5 and abs(ours_sent - time.time()) < 5


@pytest.mark.parametrize("pipeline", ["digest", None])
def test_a_pushed_step_message_is_the_one_kombu_writes(
    app: Celery, broker_url: str, queue: redis.Redis, pipeline: str | None
) -> None:
    steps = [StepPlan("a", timeout_s=10), StepPlan("b", timeout_s=20)]
    plan = JobPlan(JOB, steps, pipeline=pipeline)
    assert direct_broker(app) == broker_url

    send_plan(app, plan)
    push(broker_url, plan_messages(app, plan))

    kombu_a, kombu_b, ours_a, ours_b = (_next(queue) for _ in range(4))
    assert queue.llen(QUEUE_STEPS) == 0
    _same_but_fresh(ours_a, kombu_a)
    _same_but_fresh(ours_b, kombu_b)
    soft_s = 10 + CHAIN_SLICE_S
    assert ours_a["headers"]["timelimit"] == [soft_s + STEP_TIMEOUT_GRACE_S, soft_s]
    assert ours_a["headers"]["shadow"] == (f"{pipeline}/a" if pipeline else None)


def test_publish_plan_pushes_plain_steps_and_leaves_fan_outs_to_celery(
    app: Celery, queue: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[JobPlan] = []
    monkeypatch.setattr("tasks.dispatch.send_plan", lambda _, plan: sent.append(plan))
    plain = JobPlan(JOB, [StepPlan("a", 10)], pipeline="digest")
    fanned = JobPlan(JOB, [StepPlan("b", 10, shards=[0], max_parallel=1)], pipeline="digest")

    publish_plan(app, plain)
    publish_plan(app, fanned)

    assert sent == [fanned]
    assert _next(queue)["headers"]["shadow"] == "digest/a"


def test_a_publish_signal_receiver_keeps_celerys_publish(app: Celery, broker_url: str) -> None:
    assert direct_broker(app) == broker_url

    def tracer(**_: Any) -> None:
        """A receiver, as a tracing library connects one to add its headers."""

    before_task_publish.connect(tracer)
    try:
        assert direct_broker(app) is None
    finally:
        before_task_publish.disconnect(tracer)
    assert direct_broker(app) == broker_url


@pytest.mark.parametrize(
    "setting",
    [
        {"task_send_sent_event": True},
        {"task_compression": "gzip"},
        {"task_protocol": 1},
        {"broker_transport_options": {"global_keyprefix": "fb:"}},
    ],
)
def test_a_setting_that_would_change_the_message_keeps_celerys_publish(
    app: Celery, setting: dict[str, Any]
) -> None:
    app.conf.update(setting)
    assert direct_broker(app) is None


def test_task_events_for_flower_come_from_workers_and_keep_the_direct_push(
    broker_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A producer's ``task-sent`` names the task, not the step: arriving after a worker's
    ``task-received`` it renamed the step in Flower, so no producer sends it."""
    from tasks import app as app_module

    monkeypatch.setattr("tasks.runtime.configure", lambda _: None)
    settings = get_settings().model_copy(update={"broker_url": broker_url, "task_events": True})
    app = app_module.create_celery(settings)
    try:
        assert app.conf.worker_send_task_events
        assert not app.conf.task_send_sent_event
        assert direct_broker(app) == broker_url
    finally:
        app.close()


def test_a_broker_other_than_plain_redis_keeps_celerys_publish(
    broker_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = _app(broker_url.replace("redis://", "rediss://"), monkeypatch)
    try:
        assert direct_broker(app) is None
    finally:
        app.close()


def test_a_push_the_broker_refuses_is_broker_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = _app(CLOSED_PORT_REDIS, monkeypatch)
    try:
        assert direct_broker(app) == CLOSED_PORT_REDIS
        with pytest.raises(BrokerUnavailable):
            publish_plan(app, JobPlan(JOB, [StepPlan("a", 10)]))
    finally:
        app.close()


@pytest.mark.timeout(60)
def test_a_broker_that_stops_answering_fails_a_push_instead_of_holding_it(
    broker_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition drops packets without closing a connection: the push gives up after its
    timeout and retries, and the caller hears that the broker is unavailable."""
    broker = urlsplit(broker_url)
    with TcpProxy(broker.hostname or "", broker.port or 6379) as proxy:
        app = _app(broker._replace(netloc=f"127.0.0.1:{proxy.port}").geturl(), monkeypatch)
        plan = JobPlan(JOB, [StepPlan("a", 10)])
        try:
            publish_plan(app, plan)
            proxy.stall()
            started = time.monotonic()
            with pytest.raises(BrokerUnavailable):
                publish_plan(app, plan)
            waited = time.monotonic() - started
        finally:
            app.close()

    assert waited < (BROKER_PUBLISH_RETRIES + 1) * (BROKER_PUSH_TIMEOUT_S + 1)


def test_jobs_published_together_answer_each_for_itself(
    app: Celery, queue: redis.Redis, broker_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_: object) -> None:
        raise RuntimeError("celery could not build the fan-out")

    monkeypatch.setattr("tasks.dispatch.publish_new_job", broken)
    first = JobPlan(uuid.uuid4(), [StepPlan("a", 10)], pipeline="digest")
    fanned = JobPlan(uuid.uuid4(), [StepPlan("b", 10, shards=[0], max_parallel=1)])
    last = JobPlan(uuid.uuid4(), [StepPlan("c", 10)], pipeline="digest")

    runtime = Runtime.start(get_settings())

    async def together() -> list[Exception | None]:
        client = async_broker_client(broker_url)
        try:
            return await publish_new_jobs_async(app, runtime, client, [first, fanned, last])
        finally:
            await client.aclose()

    try:
        outcomes = asyncio.run(together())
    finally:
        runtime.sessions.kw["bind"].dispose()

    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], RuntimeError)
    assert [_next(queue)["headers"]["shadow"] for _ in range(2)] == ["digest/a", "digest/c"]


SENTINEL_URL = "sentinel://:pw@127.0.0.1:26379;sentinel://127.0.0.1:26380/0"


def test_a_sentinel_broker_pushes_through_the_primary_the_sentinels_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fast path stays: the push goes to the master the app's transport options name,
    and Celery's transport and backend are the Sentinel ones, on the canonical URL."""
    from tasks import app as app_module

    monkeypatch.setattr("tasks.runtime.configure", lambda _: None)
    settings = get_settings().model_copy(
        update={"broker_url": SENTINEL_URL, "broker_sentinel_master": "main"}
    )
    app = app_module.create_celery(settings)
    try:
        canonical = "sentinel://:pw@127.0.0.1:26379/0;sentinel://:pw@127.0.0.1:26380/0"
        assert app.conf.broker_url == canonical
        assert app.conf.broker_transport == "tasks.transport:SentinelTransport"
        assert app.conf.broker_transport_options["master_name"] == "main"
        assert app.conf.result_backend_transport_options["master_name"] == "main"
        assert type(app.backend).__name__ == "PublishOnlySentinelBackend"
        assert direct_broker(app) == BrokerAddress(canonical, "main")
        assert "LivenessStep" in {step.__name__ for step in app.steps["worker"]}
    finally:
        app.close()


def test_a_worker_that_fails_over_to_the_next_sentinel_keeps_flowbeats_transport(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Celery's failover switches the connection to the next URL, and kombu then takes the
    transport from its scheme: it must still be flowbeat's, not kombu's own."""
    from tasks import app as app_module
    from tasks.transport import SentinelTransport

    monkeypatch.setattr("tasks.runtime.configure", lambda _: None)
    settings = get_settings().model_copy(
        update={"broker_url": SENTINEL_URL, "broker_sentinel_master": "main"}
    )
    app = app_module.create_celery(settings)
    try:
        with app.connection_for_read() as connection:
            assert type(connection.transport) is SentinelTransport
            connection.switch(connection.alt[1])
            assert type(connection.transport) is SentinelTransport
    finally:
        app.close()
