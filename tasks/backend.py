"""The result backend, minus the per-message pub/sub subscription.

Celery's Redis backend subscribes to every task it sends so that a caller may wait on the
result. Nobody here waits on a Celery result (job state lives in PostgreSQL), so each publish
would pay for a subscribe and an unsubscribe for nothing.
"""

from typing import Any

from celery.backends.redis import RedisBackend


class PublishOnlyRedisBackend(RedisBackend):  # type: ignore[misc]
    def on_task_call(self, producer: Any, task_id: str) -> None:
        return None

    def on_result_fulfilled(self, result: Any) -> None:
        return None


def backend_url(redis_url: str) -> str:
    return f"{__name__}:{PublishOnlyRedisBackend.__name__}+{redis_url}"
