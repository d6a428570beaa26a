"""A linear plan is sent as the very message Celery's chain sends; other plans as their canvas."""

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from kombu.message import Message

from service.constants import QUEUE_STEPS, TASK_RUN_STEP
from service.plan import JobPlan, StepPlan
from tasks.canvas import job_canvas, send_plan

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
    """Headers and body with the fresh ids of one publish left out."""
    headers = {k: v for k, v in message.headers.items() if k not in ("id", "root_id", "origin")}
    args, kwargs, embed = message.payload
    chain = [
        {**sig, "options": {k: v for k, v in sig["options"].items() if k != "task_id"}}
        for sig in embed["chain"] or []
    ]
    return headers, (args, kwargs, {**embed, "chain": chain})


def _plan(*layers: list[StepPlan]) -> JobPlan:
    return JobPlan(JOB, list(layers))


@pytest.mark.parametrize("length", [1, 2, 3, 5])
def test_a_linear_plan_goes_out_as_the_message_of_its_chain(app: Celery, length: int) -> None:
    plan = _plan(*([StepPlan(f"s{n}", timeout_s=10 + n)] for n in range(length)))

    [ours] = _sent(app, lambda: send_plan(app, plan))
    [celerys] = _sent(app, lambda: job_canvas(app, plan).apply_async())

    assert _without_ids(ours) == _without_ids(celerys)
    assert ours.headers["task"] == TASK_RUN_STEP
    assert ours.headers["root_id"] == ours.headers["id"]
    assert ours.headers["timelimit"] == [15, 10]


def test_every_step_of_a_linear_plan_has_its_own_task_id(app: Celery) -> None:
    plan = _plan(*([StepPlan(f"s{n}", timeout_s=10)] for n in range(4)))

    [message] = _sent(app, lambda: send_plan(app, plan))

    ids = [message.headers["id"]] + [s["options"]["task_id"] for s in message.payload[2]["chain"]]
    assert len(set(ids)) == 4


@pytest.mark.parametrize(
    "plan",
    [
        _plan([StepPlan("a", 10), StepPlan("b", 10)], [StepPlan("c", 10)]),
        _plan([StepPlan("a", 10)], [StepPlan("b", 10, shards=[0, 1], max_parallel=2)]),
    ],
    ids=["a group", "a fan-out"],
)
def test_a_plan_with_a_group_or_a_fan_out_goes_out_as_its_canvas(
    app: Celery, plan: JobPlan
) -> None:
    ours = _sent(app, lambda: send_plan(app, plan))
    celerys = _sent(app, lambda: job_canvas(app, plan).apply_async())

    assert [m.headers["task"] for m in ours] == [m.headers["task"] for m in celerys]
    assert [m.payload[0] for m in ours] == [m.payload[0] for m in celerys]
