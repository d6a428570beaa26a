"""Thin step tasks: ids in, service call, nothing else."""

import uuid

from celery.exceptions import SoftTimeLimitExceeded

from service import runner
from service.constants import TASK_FINISH_FANOUT, TASK_RUN_LANE, TASK_RUN_STEP
from service.steps import StepKey
from tasks import canvas, runtime
from tasks.app import app
from tasks.base import FlowbeatTask

TIMEOUTS = (SoftTimeLimitExceeded,)


@app.task(bind=True, base=FlowbeatTask, name=TASK_RUN_STEP)
def run_step(self: FlowbeatTask, job_id: str, step_id: str) -> None:
    key = StepKey(uuid.UUID(job_id), step_id)
    fanned = runner.run_step(runtime.get(), key, task_id=self.request.id, timeout_errors=TIMEOUTS)
    if fanned is not None:
        lanes = min(fanned.max_parallel, len(fanned.shards))
        self.replace(canvas.fan_out(self.app, key, lanes, fanned.timeout_s))


@app.task(bind=True, base=FlowbeatTask, name=TASK_RUN_LANE)
def run_lane(self: FlowbeatTask, job_id: str, step_id: str, timeout_s: int) -> None:
    """One of ``max_parallel`` lanes of a fan-out: one shard per message, then the next."""
    key = StepKey(uuid.UUID(job_id), step_id)
    ran = runner.run_lane(runtime.get(), key, task_id=self.request.id, timeout_errors=TIMEOUTS)
    if ran:
        self.replace(canvas.lane(self.app, key, timeout_s))


@app.task(bind=True, base=FlowbeatTask, name=TASK_FINISH_FANOUT)
def finish_fanout(self: FlowbeatTask, job_id: str, step_id: str) -> None:
    runner.run_finish_fanout(runtime.get(), StepKey(uuid.UUID(job_id), step_id))
