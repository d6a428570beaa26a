"""One base class maps the engine's small vocabulary of outcomes onto Celery."""

import time
from typing import Any

import psycopg
from celery import Task
from celery.exceptions import Ignore
from sqlalchemy.exc import OperationalError

from service.platform import tracing
from service.platform.constants import HEADER_SENT_AT
from service.platform.errors import RetryLater, StopChain
from service.platform.metrics import STEP_QUEUE_WAIT

DATABASE_RETRY_S = 2.0


class FlowbeatTask(Task):  # type: ignore[misc]
    """``RetryLater`` → deliver again later; ``StopChain`` → drop the rest of the canvas.

    A database outage is a ``RetryLater`` too: the message stays ours until PostgreSQL is back.
    ``max_retries = None`` is what makes that unbounded: ``retry(max_retries=None)`` alone
    falls back to Celery's default of three retries, then fails the task and drops its message.
    """

    max_retries = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        sent_at = self.request.get(HEADER_SENT_AT)
        if isinstance(sent_at, int | float) and not self.request.retries:
            STEP_QUEUE_WAIT.labels(self.name).observe(max(0.0, time.time() - sent_at))
        try:
            with tracing.span(
                self.name, self.request.get(tracing.TRACEPARENT), retries=self.request.retries or 0
            ):
                return super().__call__(*args, **kwargs)
        except RetryLater as exc:
            raise self.retry(countdown=exc.delay_s) from None
        except (OperationalError, psycopg.OperationalError):
            raise self.retry(countdown=DATABASE_RETRY_S) from None
        except StopChain:
            raise Ignore() from None
