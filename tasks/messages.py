"""A plain step's message built here and pushed onto its queue with one ``LPUSH``.

Celery's publish of one step message (``send_task``: the router, ``as_task_v2``, the producer
pool, kombu's ``Producer.publish``, its body encoding and its connection ``ensure``) was a fifth
of the CPU the API spends on a job; what reaches Redis is one JSON document pushed onto the
queue's list. Built here it costs a small fraction of that, and it is the same document: the
same body, headers, properties and delivery info that kombu's Redis transport writes, as
``tests/tasks/test_messages.py`` pins field by field against kombu.

Only where nothing else would change that document: a Redis broker (plain or Sentinel), Celery's
protocol 2 in JSON without compression, no task-sent events, nobody listening to the publish
signals (a tracer adding its headers), and no task running in this thread (a worker's task
would make itself the message's parent). Anywhere else Celery publishes as before.
"""

import base64
import json
import time
import uuid
import weakref
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.retry
from celery import Celery, signals
from celery.utils.nodenames import anon_nodename
from redis.backoff import ConstantBackoff
from redis.retry import Retry

from service.engine.steps import StepKey
from service.language.plan import JobPlan, StepPlan
from service.platform import tracing
from service.platform.brokers import (
    BrokerAddress,
    async_redis_client,
    is_sentinel,
    redis_client,
)
from service.platform.constants import (
    BROKER_PUBLISH_RETRIES,
    BROKER_PUBLISH_RETRY_INTERVAL_S,
    BROKER_PUSH_TIMEOUT_S,
    HEADER_SENT_AT,
    TASK_RUN_STEP,
)
from tasks.canvas import readable, step_limits
from tasks.queues import broker_level, queue_name, step_list

DIRECT_BROKER_SCHEMES = ("redis://", "sentinel://")
_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
_PUBLISH_SIGNALS = (signals.before_task_publish, signals.after_task_publish, signals.task_sent)
_DELIVERY_MODE_PERSISTENT = 2
_PERSISTENT = (_DELIVERY_MODE_PERSISTENT, "persistent")
_KWARGSREPR = repr({})


def direct_broker(app: Celery) -> BrokerAddress | str | None:
    """The broker when a step message built here is the one Celery would send: a plain
    ``redis://`` one as its URL, whose cached client is found by the string's own hash, a
    Sentinel one with its master's name."""
    if any(signal.receivers for signal in _PUBLISH_SIGNALS) or app.current_worker_task:
        return None
    return _configured_broker(app)


_CONFIGURED: weakref.WeakKeyDictionary[Celery, BrokerAddress | str | None] = (
    weakref.WeakKeyDictionary()
)


def _configured_broker(app: Celery) -> BrokerAddress | str | None:
    """Read once per app, as Celery reads the serializer and compression of its publishes once:
    reading the configuration on every message cost as much as building it."""
    try:
        return _CONFIGURED[app]
    except KeyError:
        pass
    conf = app.conf
    url = conf.broker_write_url
    options = conf.broker_transport_options
    plain = (
        isinstance(url, str)
        and url.startswith(DIRECT_BROKER_SCHEMES)
        and conf.task_protocol == 2
        and conf.task_serializer == "json"
        and conf.task_compression is None
        and not conf.task_send_sent_event
        and conf.task_default_delivery_mode in _PERSISTENT
        and not options.get("global_keyprefix")
    )
    _CONFIGURED[app] = _address(url, options) if plain else None
    return _CONFIGURED[app]


def _address(url: str, options: dict[str, Any]) -> BrokerAddress | str:
    if not is_sentinel(url):
        return url
    sentinels = options.get("sentinel_kwargs") or {}
    return BrokerAddress(url, options.get("master_name"), sentinels.get("password"))


def plain_steps(plan: JobPlan) -> bool:
    """Whether every message of ``plan`` is a plain step's (no compensation, no fan-out)."""
    return not plan.compensate and all(step.shards is None for step in plan.steps)


def step_message(app: Celery, plan: JobPlan, step: StepPlan) -> str:
    """kombu's Redis envelope of the message ``tasks.canvas.step_signature`` sends for a plain
    step, with fresh ids and send time; JSON as kombu's ``dumps`` writes it."""
    task_id = str(uuid.uuid4())
    names = readable(StepKey(plan.job_id, step.step_id), plan.pipeline)
    limit = step_limits(step)
    headers = {
        "lang": "py",
        "task": TASK_RUN_STEP,
        "id": task_id,
        "shadow": names.get("shadow"),
        "eta": None,
        "expires": None,
        "group": None,
        "group_index": None,
        "retries": 0,
        "timelimit": [limit["time_limit"], limit["soft_time_limit"]],
        "root_id": task_id,
        "parent_id": None,
        "argsrepr": names["argsrepr"],
        "kwargsrepr": _KWARGSREPR,
        "origin": anon_nodename(),
        "ignore_result": True,
        "replaced_task_nesting": 0,
        "stamped_headers": None,
        "stamps": {},
        HEADER_SENT_AT: time.time(),
    }
    trace = plan.trace or tracing.traceparent()
    if trace is not None:
        headers[tracing.TRACEPARENT] = trace
    body = json.dumps([[str(plan.job_id), step.step_id], {}, _EMBED])
    message: dict[str, Any] = {
        "body": base64.b64encode(body.encode()).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": headers,
        "properties": {
            "correlation_id": task_id,
            "reply_to": app.thread_oid,
            "argsrepr": names["argsrepr"],
            "kwargsrepr": _KWARGSREPR,
            "delivery_mode": _DELIVERY_MODE_PERSISTENT,
            "delivery_info": {"exchange": "", "routing_key": queue_name(step.queue)},
            "priority": broker_level(plan.priority),
            "body_encoding": "base64",
            "delivery_tag": str(uuid.uuid4()),
        },
    }
    return json.dumps(message)


Outgoing = tuple[str, str]
"""A message and the list it is pushed onto."""


def plan_messages(app: Celery, plan: JobPlan) -> list[Outgoing]:
    return [(step_list(s.queue, plan.priority), step_message(app, plan, s)) for s in plan.steps]


def _by_list(messages: Sequence[Outgoing]) -> dict[str, list[str]]:
    lists: dict[str, list[str]] = {}
    for key, message in messages:
        lists.setdefault(key, []).append(message)
    return lists


def _retry() -> Retry:
    """Celery retries a publish three times, 0.2 s apart at most; so does a push here."""
    return Retry(ConstantBackoff(BROKER_PUBLISH_RETRY_INTERVAL_S), BROKER_PUBLISH_RETRIES)


@lru_cache(maxsize=4)
def broker_client(broker: BrokerAddress | str) -> redis.Redis:
    """One pool per broker and process; redis-py replaces its connections after a fork."""
    return redis_client(
        broker,
        retry=_retry(),
        socket_timeout=BROKER_PUSH_TIMEOUT_S,
        socket_connect_timeout=BROKER_PUSH_TIMEOUT_S,
    )


def push(broker: BrokerAddress | str, messages: Sequence[Outgoing]) -> None:
    """Oldest first: ``LPUSH a b`` leaves ``a`` rightmost, where workers pop from. Messages
    for several lists go in one round trip."""
    lists = _by_list(messages)
    if len(lists) == 1:
        [(key, values)] = lists.items()
        broker_client(broker).lpush(key, *values)
    elif lists:
        with broker_client(broker).pipeline(transaction=False) as pipe:
            for key, values in lists.items():
                pipe.lpush(key, *values)
            pipe.execute()


def async_broker_client(broker: BrokerAddress | str) -> redis.asyncio.Redis:
    """For one event loop: its connections belong to the loop that opened them."""
    retry = redis.asyncio.retry.Retry(
        ConstantBackoff(BROKER_PUBLISH_RETRY_INTERVAL_S), BROKER_PUBLISH_RETRIES
    )
    return async_redis_client(
        broker,
        retry=retry,
        socket_timeout=BROKER_PUSH_TIMEOUT_S,
        socket_connect_timeout=BROKER_PUSH_TIMEOUT_S,
    )


async def push_async(client: redis.asyncio.Redis, messages: Sequence[Outgoing]) -> None:
    """``push`` on an event loop."""
    lists = _by_list(messages)
    if len(lists) == 1:
        [(key, values)] = lists.items()
        await client.lpush(key, *values)
    elif lists:
        async with client.pipeline(transaction=False) as pipe:
            for key, values in lists.items():
                pipe.lpush(key, *values)
            await pipe.execute()
