"""The Celery app: JSON only, late acks, requeue on worker loss, a queue for each pool of
workers (``FLOWBEAT_WORKER_QUEUES``, the default queue unless told) and one for the sweeper
that every worker consumes.

``celery -A tasks.app worker`` and ``flowbeat worker`` both load this module, and with it
``tasks.telemetry``'s signal handlers (logging, metrics exporters).
"""

import gc
import os
from dataclasses import replace
from datetime import timedelta
from typing import Any

from celery import Celery
from celery.signals import beat_init, worker_before_create_process, worker_init, worker_process_init
from kombu.entity import Exchange, Queue

from service.platform import tracing
from service.platform.constants import (
    QUEUE_CONTROL,
    QUEUE_STEPS,
    REDIS_HEALTH_CHECK_S,
    REDIS_SOCKET_TIMEOUT_S,
    TASK_SWEEP,
)
from service.platform.settings import Settings, get_settings
from tasks import runtime, telemetry  # noqa: F401
from tasks.backend import backend_url
from tasks.liveness import LivenessStep
from tasks.queues import queue_name
from tasks.timers import CompactTimers
from tasks.transport import keep_across_failovers, message_router, transport_for

CELERY_URL_VARIABLES = (
    "CELERY_BROKER_URL",
    "CELERY_BROKER_READ_URL",
    "CELERY_BROKER_WRITE_URL",
    "CELERY_RESULT_BACKEND",
)
"""Variables Celery reads ahead of the broker and backend an app is built with
(``celery.app.utils.Settings``), so one left in the environment would send every message
elsewhere, whatever the settings say."""


def create_celery(settings: Settings) -> Celery:
    """An app on the broker ``settings`` name, and none other: without one, Celery would fall
    back to ``amqp://guest@localhost:5672``, where a command that imported this module before
    it resolved its settings (the embedded default's broker) published into a server nobody
    consumes, or failed where none runs."""
    overriding = [name for name in CELERY_URL_VARIABLES if os.environ.get(name)]
    if overriding:
        raise RuntimeError(
            f"{', '.join(overriding)} is set: Celery would use it over FLOWBEAT_BROKER_URL "
            "and FLOWBEAT_RESULT_BACKEND_URL; unset it and set those instead"
        )
    broker = settings.broker()
    broker_url = broker.celery_url()
    results = replace(broker, url=settings.result_backend_url or broker.url)
    app = Celery("flowbeat", broker=broker_url, backend=backend_url(results.celery_url()))
    app.conf.update(
        broker_transport=transport_for(broker_url),
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        task_default_queue=QUEUE_STEPS,
        task_queues=(
            *(_direct_queue(queue_name(queue)) for queue in settings.worker_queues),
            _direct_queue(QUEUE_CONTROL),
        ),
        task_routes=(message_router(broker_url, QUEUE_STEPS, {TASK_SWEEP: QUEUE_CONTROL}),),
        task_track_started=False,
        worker_send_task_events=settings.task_events,
        task_send_sent_event=False,
        worker_prefetch_multiplier=settings.worker_prefetch,
        worker_disable_prefetch=settings.worker_disable_prefetch,
        worker_concurrency=settings.worker_concurrency,
        worker_hijack_root_logger=False,
        broker_transport_options={
            "visibility_timeout": settings.visibility_timeout_s,
            "unacked_restore_interval": settings.unacked_restore_interval_s,
            "unacked_restore_throttle": 1,
            "socket_timeout": REDIS_SOCKET_TIMEOUT_S,
            "socket_connect_timeout": REDIS_SOCKET_TIMEOUT_S,
            "socket_keepalive": True,
            "health_check_interval": REDIS_HEALTH_CHECK_S,
            **broker.transport_options(REDIS_SOCKET_TIMEOUT_S),
        },
        result_backend_transport_options={
            "visibility_timeout": settings.visibility_timeout_s,
            **results.transport_options(REDIS_SOCKET_TIMEOUT_S),
        },
        redis_socket_timeout=REDIS_SOCKET_TIMEOUT_S,
        redis_socket_connect_timeout=REDIS_SOCKET_TIMEOUT_S,
        redis_socket_keepalive=True,
        redis_backend_health_check_interval=REDIS_HEALTH_CHECK_S,
        broker_connection_retry_on_startup=True,
        result_expires=timedelta(seconds=settings.result_expires_s),
        result_extended=False,
        enable_utc=True,
        timezone="UTC",
        beat_schedule={
            "flowbeat-sweep": {"task": TASK_SWEEP, "schedule": settings.sweep_interval_s},
        },
    )
    app.conf.include = [
        "tasks.steps",
        "tasks.sweep",
        "tasks.notices",
        "tasks.approvals",
        "tasks.alerts",
    ]
    app.steps["worker"].add(CompactTimers)
    if transport_for(broker_url) is not None:
        keep_across_failovers()
        app.steps["worker"].add(LivenessStep)
    runtime.configure(settings)
    return app


def _direct_queue(name: str) -> Any:
    """Named as the default queue is (exchange and routing key its own name): with the same
    routing key, another queue would be bound to receive a copy of every step's message."""
    return Queue(name, Exchange(name), routing_key=name)  # type: ignore[no-untyped-call]


@worker_init.connect
def _trace_worker(**_: Any) -> None:
    tracing.configure("flowbeat-worker")


@beat_init.connect
def _trace_beat(**_: Any) -> None:
    tracing.configure("flowbeat-beat")


@worker_process_init.connect
def _fresh_connections_after_fork(**_: Any) -> None:
    """A forked pool process must not share the parent's database connections."""
    runtime.reset()


@worker_before_create_process.connect
def _freeze_before_fork(**_: Any) -> None:
    """Move what the worker holds into the collector's permanent generation before a pool
    process is forked, as CPython's ``gc.freeze`` documentation advises for prefork servers.

    Every ``Task.replace`` (a fan-out, a lane sent on) raises ``Ignore``, and Celery keeps a
    picklable copy of its traceback (billiard's ``ExceptionInfo``, with every frame's code
    positions on Python 3.11+, some 300 KiB) in a reference cycle through the frame that
    ran the task, which its fix for Celery issue #8882 cannot clear while that frame runs.
    The cycle outlives the young generations, and CPython collects the oldest one only once
    the objects promoted since its last full collection reach a quarter of those it held
    then: for a pool process, the some 150,000 it inherited. A pool process sending fan-outs
    kept every such copy: 18 MiB a minute at one fan-out a second. Frozen, the inherited
    objects are left out of collections, which then neither wait for them nor write to, and
    so copy, the pages the process shares with its parent."""
    gc.freeze()


@worker_process_init.connect
def _collect_after_fork(**_: Any) -> None:
    """The pool process's first full collection, cheap with the inherited objects frozen: the
    next one then waits for a quarter of its own objects, not of its parent's."""
    gc.collect()


app = create_celery(get_settings())
