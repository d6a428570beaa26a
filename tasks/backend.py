"""The result backend, minus the per-message pub/sub subscription and the results kept waiting.

Celery's Redis backend subscribes to every task it sends so that a caller may wait on the
result. Nobody here waits on a Celery result (job state lives in PostgreSQL), so each publish
would pay for a subscribe and an unsubscribe for nothing.

Freezing a chord does the same for every task of its header: the group's barrier registers each
lane's result with the backend as pending, and the backend subscribes to its channel and holds
the result until it is fulfilled. Nothing fulfils it in the worker that sent the fan-out (only
a caller draining the backend would), so a pool process kept every lane it ever sent, a few KiB
each, and the broker one channel per lane (Celery issues #4824, #6963, #3812).
"""

from typing import Any

from celery.backends.redis import RedisBackend, SentinelBackend

from service.platform.brokers import is_sentinel


class PublishOnlyRedisBackend(RedisBackend):  # type: ignore[misc]
    def on_task_call(self, producer: Any, task_id: str) -> None:
        return None

    def on_result_fulfilled(self, result: Any) -> None:
        return None

    def add_pending_result(
        self, result: Any, weak: bool = False, start_drainer: bool = True
    ) -> Any:
        return result


class PublishOnlySentinelBackend(PublishOnlyRedisBackend, SentinelBackend):  # type: ignore[misc]
    """The same on the primary the sentinels name."""


def backend_url(redis_url: str) -> str:
    backend = PublishOnlySentinelBackend if is_sentinel(redis_url) else PublishOnlyRedisBackend
    return f"{__name__}:{backend.__name__}+{redis_url}"
