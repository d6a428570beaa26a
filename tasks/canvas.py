"""Messages for the steps of a plan: one per ready step, a chord for a fanned-out step.

Every signature is immutable and carries ids only; a step reads its inputs from PostgreSQL.
What a person reads in Flower and the worker logs is set beside the payload: the task shows
as ``<pipeline>/<step>`` (Celery's ``shadow`` name) and its arguments as ``job=… step=…``
(``argsrepr``).
No message carries what comes after its step: the step that settles last among a child's
upstream sends the child (``service.engine.completion.release_children``), or runs it next
itself when it was the child's only upstream and the message's time limits still hold the
child's timeout (``tasks.inline``).
"""

import uuid
from typing import Any

from celery import Celery, chord
from celery.canvas import Signature

from service.engine.compensations import Due
from service.engine.steps import StepKey
from service.language.plan import JobPlan, StepPlan
from service.platform.constants import (
    CHAIN_SLICE_S,
    DEFAULT_QUEUE,
    LANE_SLICE_S,
    STEP_TIMEOUT_GRACE_S,
    TASK_COMPENSATE,
    TASK_FINISH_FANOUT,
    TASK_RUN_LANE,
    TASK_RUN_STEP,
)
from tasks.queues import broker_level, queue_name

Route = tuple[str, int]
"""A message's queue and priority."""
DEFAULT_ROUTE: Route = (DEFAULT_QUEUE, 0)


def limits(timeout_s: int) -> dict[str, int]:
    return {"soft_time_limit": timeout_s, "time_limit": timeout_s + STEP_TIMEOUT_GRACE_S}


def readable(key: StepKey, pipeline: str | None, part: str = "") -> dict[str, Any]:
    """Message options naming the step for people; the task's own name and payload stay."""
    names: dict[str, Any] = {"argsrepr": f"job={key.job_id} step={key.step_id}"}
    if pipeline:
        names["shadow"] = f"{pipeline}/{key.step_id}{part}"
    return names


def routed(queue: str, priority: int) -> dict[str, Any]:
    """Message options sending it to ``queue``'s list for ``priority`` (``tasks.queues``)."""
    return {"queue": queue_name(queue), "priority": broker_level(priority)}


def lane(
    app: Celery,
    key: StepKey,
    timeout_s: int,
    pipeline: str | None = None,
    route: Route = DEFAULT_ROUTE,
) -> Signature:
    """A lane's message may start a shard until ``LANE_SLICE_S`` has passed; its limits are
    that much longer, so every shard it starts still has ``timeout_s`` to run."""
    return app.signature(
        TASK_RUN_LANE,
        args=(str(key.job_id), key.step_id, timeout_s),
        immutable=True,
        ignore_result=True,
    ).set(**limits(timeout_s + LANE_SLICE_S), **readable(key, pipeline, " lane"), **routed(*route))


def fan_out(
    app: Celery,
    key: StepKey,
    lanes: int,
    timeout_s: int,
    pipeline: str | None = None,
    route: Route = DEFAULT_ROUTE,
) -> Signature:
    """A dynamic chord: ``lanes`` workers drain the shards, then the results are gathered.

    No task of it stores a result: the chord counts its lanes in its own join list, which
    the backend deletes once the gather is sent, and PostgreSQL holds what the lanes did,
    so no key is left in Redis to expire an hour later."""
    finish = app.signature(
        TASK_FINISH_FANOUT, args=(str(key.job_id), key.step_id), immutable=True, ignore_result=True
    ).set(**readable(key, pipeline, " gather"), **routed(*route))
    if lanes == 0:
        return finish
    return chord([lane(app, key, timeout_s, pipeline, route) for _ in range(lanes)], finish)


def step_signature(app: Celery, plan: JobPlan, step: StepPlan) -> Signature:
    key = StepKey(plan.job_id, step.step_id)
    route = (step.queue, plan.priority)
    if step.shards is not None:
        lanes = min(step.max_parallel, len(step.shards))
        return fan_out(app, key, lanes, step.timeout_s, plan.pipeline, route)
    return app.signature(
        TASK_RUN_STEP, args=(str(plan.job_id), step.step_id), immutable=True, ignore_result=True
    ).set(**step_limits(step), **readable(key, plan.pipeline), **routed(*route))


def step_limits(step: StepPlan) -> dict[str, int]:
    """A plain step's message's time limits, wherever that message is built: longer than the
    step's timeout by the slice in which its worker may run the steps that follow it."""
    return limits(step.timeout_s + CHAIN_SLICE_S)


def send_compensation(app: Celery, job_id: uuid.UUID, due: Due | None, priority: int) -> None:
    """The message for the compensation ``due``, with its time limits, on the queue of the
    step it undoes; without ``due``, an unlimited message whose worker (of the default queue)
    only looks up the next one and sends its message."""
    if due is None:
        app.send_task(
            TASK_COMPENSATE,
            (str(job_id),),
            ignore_result=True,
            **routed(DEFAULT_QUEUE, priority),
        )
        return
    app.send_task(
        TASK_COMPENSATE,
        (str(job_id), due.step_id),
        ignore_result=True,
        **limits(due.timeout_s),
        **routed(due.queue, priority),
    )


def send_plan(app: Celery, plan: JobPlan) -> None:
    """Publish a message for every step of the plan. A plain step's message goes out through
    ``send_task`` with its limits, sparing the signature's clone and freeze on the path every
    step of every job takes; a fan-out's chord is sent as Celery builds it."""
    if plan.compensate:
        send_compensation(app, plan.job_id, None, plan.priority)
    for step in plan.steps:
        signature = step_signature(app, plan, step)
        if step.shards is not None:
            signature.apply_async()
            continue
        app.send_task(signature.task, signature.args, **signature.options)
