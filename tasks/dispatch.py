"""Publishing: always after the job's transaction committed, always from PostgreSQL's view."""

import asyncio
import logging
import uuid
from collections.abc import Sequence
from dataclasses import replace

import redis.asyncio
from celery import Celery
from kombu.exceptions import OperationalError as KombuOperationalError
from redis.exceptions import RedisError
from sqlalchemy import select

from service.engine.runtime import Runtime
from service.engine.settle import settle_job
from service.engine.submission import mark_dispatched
from service.language.plan import JobPlan, initial_plan, load_plan
from service.language.snapshots import job_profile
from service.platform import tracing
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from service.platform.errors import BrokerUnavailable
from service.platform.models import JobRow
from tasks.canvas import send_plan
from tasks.messages import direct_broker, plain_steps, plan_messages, push, push_async

log = logging.getLogger(__name__)


def publish_plan(app: Celery, plan: JobPlan) -> None:
    """Send the canvas, plain steps with one ``LPUSH`` where that is what Celery would send;
    raises BrokerUnavailable if the broker did not take it."""
    try:
        url = direct_broker(app)
        if url is not None and plain_steps(plan):
            push(url, plan_messages(app, plan))
        else:
            send_plan(app, plan)
    except (KombuOperationalError, RedisError, ConnectionError) as exc:
        raise _unavailable(plan) from exc


def send_new_job(app: Celery, rt: Runtime, job: JobRow) -> bool:
    """Publish a job just stored as sent, its root steps at its priority; whether it was.
    A job stored waiting for a slot of its concurrency key is sent by whoever lets it in
    (``service.engine.concurrency``)."""
    if job.waiting_for is not None:
        return False
    publish_new_job(app, rt, initial_plan(job_profile(job), job.id, job.priority))
    return True


def publish_new_job(app: Celery, rt: Runtime, plan: JobPlan) -> None:
    """Publish a job stored as sent (``submit_job(publish_now=True)``); undo that on failure."""
    try:
        publish_plan(app, plan)
    except BrokerUnavailable:
        _mark_unsent(rt, plan.job_id)
        raise


async def publish_new_jobs_async(
    app: Celery, rt: Runtime, broker: redis.asyncio.Redis, plans: Sequence[JobPlan]
) -> list[Exception | None]:
    """``publish_new_job`` for jobs stored together by a caller on an event loop, with
    ``broker`` a client of the app's broker on that loop; for each plan, what its caller should
    raise, so that one job's failure is not the others'. Plain steps go out in one ``LPUSH``
    without leaving the loop, anything else is published by Celery in a thread."""
    direct = direct_broker(app) is not None
    outcomes: dict[uuid.UUID, Exception | None] = {}
    for plan in plans:
        if not (direct and plain_steps(plan)):
            outcomes[plan.job_id] = await _publish_in_thread(app, rt, plan)
    pushed = [plan for plan in plans if plan.job_id not in outcomes]
    try:
        await push_async(broker, [m for plan in pushed for m in plan_messages(app, plan)])
    except (RedisError, ConnectionError) as exc:
        await asyncio.to_thread(_mark_all_unsent, rt, [plan.job_id for plan in pushed])
        for plan in pushed:
            unavailable = _unavailable(plan)
            unavailable.__cause__ = exc
            outcomes[plan.job_id] = unavailable
    return [outcomes.get(plan.job_id) for plan in plans]


async def _publish_in_thread(app: Celery, rt: Runtime, plan: JobPlan) -> Exception | None:
    try:
        await asyncio.to_thread(publish_new_job, app, rt, plan)
    except Exception as exc:
        return exc
    return None


def _mark_unsent(rt: Runtime, job_id: uuid.UUID) -> None:
    _mark_all_unsent(rt, [job_id])


def _mark_all_unsent(rt: Runtime, job_ids: Sequence[uuid.UUID]) -> None:
    with unit_of_work(rt.sessions) as session:
        for job_id in job_ids:
            mark_dispatched(session, job_id, None)


def _unavailable(plan: JobPlan) -> BrokerUnavailable:
    return BrokerUnavailable(
        "the broker is unreachable; the job is stored and will be sent when it returns",
        {"job_id": str(plan.job_id)},
    )


def publish_or_defer(app: Celery, rt: Runtime, plan: JobPlan) -> bool:
    """Publish steps a decision or a timeout made ready; with the broker away, mark the job
    unsent instead, and the sweeper sends what PostgreSQL says is ready once it is back."""
    if not plan.steps and not plan.compensate:
        return True
    try:
        publish_plan(app, _in_job_trace(rt, plan))
    except BrokerUnavailable:
        _mark_unsent(rt, plan.job_id)
        return False
    return True


def revoke_unstarted(app: Celery, task_ids: Sequence[str]) -> bool:
    """After the commit that ended their jobs: have the workers drop the messages of these
    tasks that they hold but have not started. A started one is stopped by its own process,
    which its lease's renewal tells (``service.engine.interrupts``), never by
    ``terminate=True``: that signals the pool process, not the task, and may land in the next
    job's step. Whether the broadcast went out; if not, the ended jobs' status still keeps
    every one of these tasks from running a step."""
    if not task_ids:
        return True
    try:
        app.control.revoke(list(task_ids))
    except (KombuOperationalError, RedisError, OSError) as exc:
        log.warning("could not revoke %d tasks: %s", len(task_ids), exc)
        return False
    return True


def _in_job_trace(rt: Runtime, plan: JobPlan) -> JobPlan:
    """Sent by the beat, the sweeper or a route, outside any step of the job: its messages
    carry on the trace the job was submitted in. One read, with tracing on only."""
    if plan.trace is not None or not tracing.on():
        return plan
    with unit_of_work(rt.sessions) as session:
        parent = session.scalar(select(JobRow.traceparent).where(JobRow.id == plan.job_id))
    return plan if parent is None else replace(plan, trace=parent)


def dispatch_job(app: Celery, rt: Runtime, job_id: uuid.UUID) -> bool:
    """(Re)publish whatever of the job is unfinished. Returns whether anything was sent."""
    with unit_of_work(rt.sessions) as session:
        plan = load_plan(session, job_id)
        if plan is not None and not plan.steps:
            settle_job(session, job_id, utcnow())
    if plan is None or not plan.steps:
        return False
    publish_plan(app, plan)
    with unit_of_work(rt.sessions) as session:
        mark_dispatched(session, job_id, utcnow())
    return True
