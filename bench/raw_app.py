"""A bare Celery app with a no-op task: the baseline the flowbeat figures are compared with.

Configured from ``BENCH_RAW_REDIS_URL`` (broker and result backend) at import, like
``tasks.app``, so the worker subprocess and the submitting process build the same app.
Settings mirror ``tasks.app``: JSON, late acks, the same prefetch multiplier and concurrency.
"""

import os
from typing import Any

from celery import Celery

from service.platform.settings import Settings

QUEUE = "bench.raw"
NOOP = "bench.noop"

_url = os.environ.get("BENCH_RAW_REDIS_URL", "redis://127.0.0.1:6379/13")
_settings = Settings()

CONF: dict[str, Any] = {
    "task_serializer": "json",
    "result_serializer": "json",
    "accept_content": ["json"],
    "result_accept_content": ["json"],
    "task_acks_late": True,
    "task_reject_on_worker_lost": True,
    "task_default_queue": QUEUE,
    "task_track_started": False,
    "worker_prefetch_multiplier": _settings.worker_prefetch,
    "worker_concurrency": _settings.worker_concurrency,
    "worker_hijack_root_logger": False,
    "broker_connection_retry_on_startup": True,
    "result_extended": False,
    "enable_utc": True,
}
"""The settings of every raw Celery app of the benches, the enqueue baseline's too."""

app = Celery("bench_raw", broker=_url, backend=_url)
app.conf.update(CONF)


@app.task(name=NOOP)  # type: ignore[untyped-decorator]
def noop(**_params: Any) -> None:
    """Takes the enqueue baseline's parameters too, for when a worker consumes its queue."""
    return None
