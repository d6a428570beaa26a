"""Logs and metrics of worker and beat processes, wired through Celery's signals.

Celery's own logging set-up is replaced by ``service.logs``, so a worker's lines, Celery's
included, come out as JSON (or text on a terminal) with the job, step and attempt they are
about. A worker or beat with a metrics port serves ``/metrics`` from its main process; a
worker's pool processes are summed through prometheus-client's multiprocess files, which
``flowbeat worker`` prepares.
"""

import logging
import os
from typing import Any

from celery.signals import beat_init, setup_logging, worker_init, worker_process_shutdown

from service import logs, metrics
from service.errors import MetricsTokenRequired
from service.settings import get_settings

log = logging.getLogger(__name__)


@setup_logging.connect
def _logging(loglevel: Any = None, **_: Any) -> None:
    settings = get_settings()
    logs.configure(settings.log_format, settings.log_level)


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
