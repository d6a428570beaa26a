"""Thin step tasks: ids in, service call, then the messages of the steps it made ready."""

import uuid

from celery.exceptions import SoftTimeLimitExceeded

from service.engine import lanes, runner, saga
from service.engine.shards import FannedOut
from service.engine.steps import StepKey
from service.platform.constants import (
    DEFAULT_QUEUE,
    TASK_COMPENSATE,
    TASK_FINISH_FANOUT,
    TASK_RUN_LANE,
    TASK_RUN_STEP,
)
from tasks import canvas, runtime
from tasks.app import app
from tasks.base import FlowbeatTask
from tasks.inline import inline_for
from tasks.queues import priority_of, queue_of

TIMEOUTS = (SoftTimeLimitExceeded,)


def _pipeline(task: FlowbeatTask) -> str | None:
    """The pipeline named by the message's readable name, for the messages that replace it."""
    shadow = getattr(task.request, "shadow", None)
    return shadow.split("/", 1)[0] if isinstance(shadow, str) and "/" in shadow else None


def _route(task: FlowbeatTask) -> canvas.Route:
    """The queue and priority the message came by: a lane or gather of its step goes on in
    that queue, and every message it sends is at its job's priority, which it carries."""
    delivery = task.request.delivery_info or {}
    queue = queue_of(str(delivery.get("routing_key") or "")) or DEFAULT_QUEUE
    return queue, priority_of(delivery.get("priority"))


@app.task(bind=True, base=FlowbeatTask, name=TASK_RUN_STEP)
def run_step(self: FlowbeatTask, job_id: str, step_id: str) -> None:
    key, rt = StepKey(uuid.UUID(job_id), step_id), runtime.get()
    outcome = runner.run_step(
        rt,
        key,
        task_id=self.request.id,
        timeout_errors=TIMEOUTS,
        inline=inline_for(self, rt.settings),
    )
    route = _route(self)
    if isinstance(outcome, FannedOut):
        lanes = min(outcome.max_parallel, len(outcome.shards))
        self.replace(
            canvas.fan_out(self.app, key, lanes, outcome.timeout_s, _pipeline(self), route)
        )
    else:
        canvas.send_plan(self.app, outcome.at(route[1]))


@app.task(bind=True, base=FlowbeatTask, name=TASK_RUN_LANE)
def run_lane(self: FlowbeatTask, job_id: str, step_id: str, timeout_s: int) -> None:
    """One of ``max_parallel`` lanes of a fan-out: one shard per message, then the next."""
    key = StepKey(uuid.UUID(job_id), step_id)
    ran = lanes.run_lane(runtime.get(), key, task_id=self.request.id, timeout_errors=TIMEOUTS)
    if ran:
        self.replace(canvas.lane(self.app, key, timeout_s, _pipeline(self), _route(self)))


@app.task(bind=True, base=FlowbeatTask, name=TASK_COMPENSATE)
def compensate(self: FlowbeatTask, job_id: str, step_id: str | None = None) -> None:
    """One compensation of a saga per message, then the message for the next one, which
    carries that one's time limits."""
    key = uuid.UUID(job_id)
    due = saga.run_compensation(runtime.get(), key, step_id, timeout_errors=TIMEOUTS)
    if due is not None:
        canvas.send_compensation(self.app, key, due, _route(self)[1])


@app.task(bind=True, base=FlowbeatTask, name=TASK_FINISH_FANOUT)
def finish_fanout(self: FlowbeatTask, job_id: str, step_id: str) -> None:
    ready = runner.run_finish_fanout(runtime.get(), StepKey(uuid.UUID(job_id), step_id))
    canvas.send_plan(self.app, ready.at(_route(self)[1]))
