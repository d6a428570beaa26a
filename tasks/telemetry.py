"""Logs and metrics of worker and beat processes, wired through Celery's signals.

Celery's own logging set-up is replaced by ``service.platform.logs``, so a worker's lines, Celery's
included, come out as JSON (or text on a terminal) with the job, step and attempt they are
about. A worker or beat with a metrics port serves ``/metrics`` from its main process; a
worker's pool processes are summed through prometheus-client's multiprocess files, which
``flowbeat worker`` prepares.
"""

import inspect
import logging
import os
from typing import Any

from celery import Task
from celery.signals import (
    beat_init,
    setup_logging,
    task_postrun,
    task_prerun,
    worker_init,
    worker_process_shutdown,
)

from service.platform import logs, metrics, tracing
from service.platform.errors import MetricsTokenRequired
from service.platform.settings import get_settings

log = logging.getLogger(__name__)


@setup_logging.connect
def _logging(loglevel: Any = None, **_: Any) -> None:
    """``FLOWBEAT_LOG_LEVEL`` when it is set, else the level Celery was started with: its
    ``--loglevel`` (``flowbeat worker`` and ``flowbeat beat`` pass INFO), which an operator
    who runs ``celery`` directly expects to be obeyed."""
    settings = get_settings()
    level: str = settings.log_level
    if "log_level" not in settings.model_fields_set and isinstance(loglevel, int):
        level = logging.getLevelName(loglevel)
    logs.configure(settings.log_format, level)


_BOUND: dict[str, logs.Bound] = {}
"""The ids bound for each task running in this process, by task id, until its postrun."""
_SIGNATURES: dict[str, inspect.Signature] = {}
"""Each task's signature, by task name: read once a process, not at every task's start."""


def _signature(task: Task) -> inspect.Signature:
    known = _SIGNATURES.get(task.name)
    if known is None:
        known = _SIGNATURES[task.name] = inspect.signature(task.run)
    return known


@task_prerun.connect
def _bind_task(
    task_id: str, task: Task, args: tuple[Any, ...], kwargs: dict[str, Any], **_: Any
) -> None:
    """The task's job and step on every line until it ends, Celery's "succeeded in" or
    "retry" line about it included (logged before task_postrun)."""
    try:
        given = _signature(task).bind_partial(*args, **kwargs).arguments
    except TypeError:
        return
    job_id, step_id = given.get("job_id"), given.get("step_id")
    _BOUND[task_id] = logs.bind(
        job_id=str(job_id) if job_id else None,
        step_id=str(step_id) if step_id else None,
        trace_id=tracing.trace_id_of(task.request.get(tracing.TRACEPARENT)),
    )


@task_postrun.connect
def _unbind_task(task_id: str, **_: Any) -> None:
    logs.unbind(_BOUND.pop(task_id, []))


def _serve(port: int, role: str) -> None:
    settings = get_settings()
    token = settings.metrics_token.get_secret_value() if settings.metrics_token else None
    refusal = metrics.serve_refusal(settings.metrics_host, token)
    if refusal is not None:
        raise MetricsTokenRequired(refusal, {"host": settings.metrics_host})
    metrics.serve(settings.metrics_host, port, token)
    log.info("%s metrics on http://%s:%d/metrics", role, settings.metrics_host, port)


@worker_init.connect
def _worker_metrics(**_: Any) -> None:
    port = get_settings().worker_metrics_port
    if not port:
        return
    if not os.environ.get(metrics.MULTIPROC_ENV):
        log.error(
            "worker metrics need %s (flowbeat worker sets it); not serving them",
            metrics.MULTIPROC_ENV,
        )
        return
    _serve(port, "worker")


@worker_process_shutdown.connect
def _pool_process_gone(pid: int | None = None, **_: Any) -> None:
    metrics.process_exited(pid or os.getpid())


@beat_init.connect
def _beat_metrics(**_: Any) -> None:
    port = get_settings().beat_metrics_port
    if port:
        _serve(port, "beat")
