"""The task base class: how the engine's outcomes map onto Celery's retry and ignore."""

from typing import Any

import pytest
from celery import Celery

from service.platform.errors import RetryLater, StopChain
from tasks.base import FlowbeatTask

TIMES = 6


@pytest.fixture
def app() -> Celery:
    """A throwaway app: ``apply`` runs a task and its retries in this process."""
    return Celery("test-base", broker="memory://", backend="cache+memory://")


def test_retry_later_is_retried_past_celerys_default_of_three(app: Celery) -> None:
    calls: list[int] = []

    @app.task(bind=True, base=FlowbeatTask, name="test.flaky")  # type: ignore[untyped-decorator]
    def flaky(self: Any) -> str:
        calls.append(self.request.retries)
        if len(calls) <= TIMES:
            raise RetryLater(0.0, "not yet")
        return "done"

    assert flaky.apply().get() == "done"
    assert calls == list(range(TIMES + 1))


def test_stop_chain_ends_the_task_without_a_failure(app: Celery) -> None:
    @app.task(bind=True, base=FlowbeatTask, name="test.stop")  # type: ignore[untyped-decorator]
    def stop(self: Any) -> None:
        raise StopChain("the job is over")

    result = stop.apply()
    assert result.state == "IGNORED"
