"""An action registered with ``retry=False`` fails for good on its first failure, whatever the
step's retry policy allows; the same failure of an action left retryable is retried."""

import uuid

import pytest
from sqlalchemy import select

from service.actions import REGISTRY, StepContext
from service.engine.runner import run_step
from service.engine.runtime import Runtime
from service.engine.steps import StepKey
from service.platform.errors import ActionError, RetryLater
from service.platform.models import StepRunRow
from tests.support.fanouts import submitted


def _flaky(ctx: StepContext) -> None:
    raise ActionError("the remote end hung up", {"reason": "transport"})


def _once(ctx: StepContext) -> None:
    raise ActionError("the remote end hung up", {"reason": "transport"})


REGISTRY.register("tests.attempt.flaky", _flaky)
REGISTRY.register("tests.attempt.once", _once, retry=False)


def _submitted(runtime: Runtime, action: str, leftovers: list[uuid.UUID]) -> StepKey:
    profile = {
        "name": "attempt",
        "steps": [{"id": "call", "action": action, "retry": {"attempts": 3, "backoff_s": 60}}],
    }
    key = StepKey(submitted(runtime, profile, {}), "call")
    leftovers.append(key.job_id)
    return key


def _status(runtime: Runtime, key: StepKey) -> str:
    with runtime.sessions() as session:
        row = session.scalars(select(StepRunRow).where(StepRunRow.job_id == key.job_id)).one()
    return row.status


def test_a_retryable_failure_is_retried_under_the_step_s_policy(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    key = _submitted(runtime, "tests.attempt.flaky", leftovers)

    with pytest.raises(RetryLater):
        run_step(runtime, key, task_id=uuid.uuid4().hex)

    assert _status(runtime, key) == "retrying"


def test_an_action_registered_not_to_retry_fails_for_good_at_its_first_failure(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    key = _submitted(runtime, "tests.attempt.once", leftovers)

    run_step(runtime, key, task_id=uuid.uuid4().hex)

    assert _status(runtime, key) == "failed"
