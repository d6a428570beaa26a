"""A job plan becomes a Celery canvas: chain across layers, group within one, chord at joins.

Every signature is immutable and carries ids only; a step reads its inputs from PostgreSQL.
"""

from celery import Celery, chain, chord, group
from celery.canvas import Signature
from kombu.utils.uuid import uuid

from service.constants import (
    LANE_SLICE_S,
    STEP_TIMEOUT_GRACE_S,
    TASK_FINISH_FANOUT,
    TASK_RUN_LANE,
    TASK_RUN_STEP,
)
from service.plan import JobPlan, StepPlan
from service.steps import StepKey


def _limits(timeout_s: int) -> dict[str, int]:
    return {"soft_time_limit": timeout_s, "time_limit": timeout_s + STEP_TIMEOUT_GRACE_S}


def lane(app: Celery, key: StepKey, timeout_s: int) -> Signature:
    """A lane's message may start a shard until ``LANE_SLICE_S`` has passed; its limits are
    that much longer, so every shard it starts still has ``timeout_s`` to run."""
    return app.signature(
        TASK_RUN_LANE, args=(str(key.job_id), key.step_id, timeout_s), immutable=True
    ).set(**_limits(timeout_s + LANE_SLICE_S))


def fan_out(app: Celery, key: StepKey, lanes: int, timeout_s: int) -> Signature:
    """A dynamic chord: ``lanes`` workers drain the shards, then the results are gathered."""
    finish = app.signature(TASK_FINISH_FANOUT, args=(str(key.job_id), key.step_id), immutable=True)
    if lanes == 0:
        return finish
    return chord([lane(app, key, timeout_s) for _ in range(lanes)], finish)


def _step(app: Celery, plan: JobPlan, step: StepPlan) -> Signature:
    key = StepKey(plan.job_id, step.step_id)
    if step.shards is not None:
        return fan_out(app, key, min(step.max_parallel, len(step.shards)), step.timeout_s)
    return app.signature(TASK_RUN_STEP, args=(str(plan.job_id), step.step_id), immutable=True).set(
        **_limits(step.timeout_s)
    )


def send_plan(app: Celery, plan: JobPlan) -> None:
    """Publish a plan. A linear one (every layer one plain step, the usual pipeline) goes out as
    the message Celery's chain sends: the first step, the rest in its ``chain`` option, each
    with its task id. Built here it skips the chain's clone and freeze of every signature,
    which cost the API a third of what publishing a job costs. Any other plan is sent as its
    canvas, and a worker continues either kind the same way."""
    steps = [layer[0] for layer in plan.layers if len(layer) == 1 and layer[0].shards is None]
    if len(steps) != len(plan.layers):
        job_canvas(app, plan).apply_async()
        return
    first, *rest = (_step(app, plan, step).set(ignore_result=True) for step in steps)
    for signature in rest:
        signature.set(task_id=uuid(), reply_to=app.thread_oid)
    task_id = uuid()
    app.send_task(
        first.task,
        first.args,
        chain=rest[::-1] or None,
        task_id=task_id,
        root_id=task_id,
        **first.options,
    )


def job_canvas(app: Celery, plan: JobPlan) -> Signature:
    """Results are stored only where a chord counts them; a lone step in a layer needs none."""
    layers = [
        _step(app, plan, layer[0]).set(ignore_result=layer[0].shards is None)
        if len(layer) == 1
        else group([_step(app, plan, s) for s in layer])
        for layer in plan.layers
    ]
    return layers[0] if len(layers) == 1 else chain(*layers)
