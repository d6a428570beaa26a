"""A bare Celery app with a no-op task: the baseline the flowbeat figures are compared with.

Configured from ``BENCH_RAW_REDIS_URL`` (broker and result backend) at import, like
``tasks.app``, so the worker subprocess and the submitting process build the same app.
Settings mirror ``tasks.app``: JSON, late acks, the same prefetch multiplier and concurrency.
"""

import os

from celery import Celery

from service.platform.settings import Settings

QUEUE = "bench.raw"

_url = os.environ.get("BENCH_RAW_REDIS_URL", "redis://127.0.0.1:6379/13")
_settings = Settings()

app = Celery("bench_raw", broker=_url, backend=_url)
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    result_accept_content=["json"],
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    task_default_queue=QUEUE,
    task_track_started=False,
    worker_prefetch_multiplier=_settings.worker_prefetch,
    worker_concurrency=_settings.worker_concurrency,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    result_extended=False,
    enable_utc=True,
)


@app.task(name="bench.noop")  # type: ignore[untyped-decorator]
def noop() -> None:
    return None
