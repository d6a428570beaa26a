"""Each ready step goes out as its own message, the one Celery's ``apply_async`` would send."""

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from kombu.message import Message

from service.language.plan import JobPlan, StepPlan
from service.platform.constants import (
    CHAIN_SLICE_S,
    HEADER_SENT_AT,
    QUEUE_STEPS,
    STEP_TIMEOUT_GRACE_S,
    TASK_RUN_LANE,
    TASK_RUN_STEP,
)
from tasks.canvas import send_plan, step_signature

JOB = uuid.uuid4()


@pytest.fixture
def app() -> Iterator[Celery]:
    """Celery over in-memory transport and results: what is published can be read back here."""
    app = Celery("canvas-test", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.update(task_serializer="json", task_default_queue=QUEUE_STEPS)
    yield app
    app.close()


def _sent(app: Celery, send: Any) -> list[Message]:
    with app.connection_for_write() as conn:
        queue = conn.SimpleQueue(QUEUE_STEPS)
        send()
        messages = []
        while queue.qsize():
            messages.append(queue.get(timeout=1))
        queue.close()
    return messages


def _without_ids(message: Message) -> tuple[dict[str, Any], Any]:
    """Headers and body with the fresh ids and the send time of one publish left out."""
    fresh = ("id", "root_id", "origin", HEADER_SENT_AT)
    headers = {k: v for k, v in message.headers.items() if k not in fresh}
    return headers, message.payload


def test_a_plan_sends_one_message_per_step_with_its_time_limits(app: Celery) -> None:
    plan = JobPlan(JOB, [StepPlan("a", timeout_s=10), StepPlan("b", timeout_s=20)])

    messages = _sent(app, lambda: send_plan(app, plan))

    assert [m.headers["task"] for m in messages] == [TASK_RUN_STEP, TASK_RUN_STEP]
    assert [m.payload[0] for m in messages] == [[str(JOB), "a"], [str(JOB), "b"]]
    slice_s, grace_s = CHAIN_SLICE_S, STEP_TIMEOUT_GRACE_S
    assert [m.headers["timelimit"] for m in messages] == [
        [10 + slice_s + grace_s, 10 + slice_s],
        [20 + slice_s + grace_s, 20 + slice_s],
    ]
    assert all(m.payload[2]["chain"] is None for m in messages)


def test_a_step_message_is_the_one_its_signature_sends(app: Celery) -> None:
    plan = JobPlan(JOB, [StepPlan("a", timeout_s=10)])

    [ours] = _sent(app, lambda: send_plan(app, plan))
    [celerys] = _sent(app, lambda: step_signature(app, plan, plan.steps[0]).apply_async())

    assert _without_ids(ours) == _without_ids(celerys)
    assert ours.headers["root_id"] == ours.headers["id"]


def test_a_fanned_out_step_goes_out_as_one_lane_per_parallel_slot(app: Celery) -> None:
    plan = JobPlan(JOB, [StepPlan("b", 10, shards=[0, 1, 2], max_parallel=2)])

    messages = _sent(app, lambda: send_plan(app, plan))

    assert [m.headers["task"] for m in messages] == [TASK_RUN_LANE, TASK_RUN_LANE]
    assert [m.payload[0] for m in messages] == [[str(JOB), "b", 10]] * 2


def test_an_empty_plan_sends_nothing(app: Celery) -> None:
    assert _sent(app, lambda: send_plan(app, JobPlan(JOB))) == []


def test_a_step_message_reads_as_its_pipeline_and_step_but_carries_ids_only(app: Celery) -> None:
    plan = JobPlan(
        JOB, [StepPlan("a", 10), StepPlan("b", 10, shards=[0], max_parallel=1)], pipeline="digest"
    )

    step, lane = _sent(app, lambda: send_plan(app, plan))

    assert (step.headers["shadow"], lane.headers["shadow"]) == ("digest/a", "digest/b lane")
    assert step.headers["argsrepr"] == f"job={JOB} step=a"
    assert step.payload[0] == [str(JOB), "a"]
    [nameless] = _sent(app, lambda: send_plan(app, JobPlan(JOB, [StepPlan("a", 10)])))
    assert nameless.headers["shadow"] is None
    assert nameless.headers["argsrepr"] == f"job={JOB} step=a"
