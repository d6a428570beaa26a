"""Publishing: always after the job's transaction committed, always from PostgreSQL's view."""

import uuid

from celery import Celery
from kombu.exceptions import OperationalError as KombuOperationalError
from redis.exceptions import RedisError

from service.db import unit_of_work
from service.errors import BrokerUnavailable
from service.jobs import mark_dispatched
from service.plan import JobPlan, load_plan
from service.runner import utcnow
from service.runtime import Runtime
from service.steps import settle_job
from tasks.canvas import job_canvas


def publish_plan(app: Celery, rt: Runtime, plan: JobPlan) -> None:
    """Send the canvas, then note that it went out; raises BrokerUnavailable if it did not."""
    try:
        job_canvas(app, plan).apply_async()
    except (KombuOperationalError, RedisError, ConnectionError) as exc:
        raise BrokerUnavailable(
            "the broker is unreachable; the job is stored and will be sent when it returns",
            {"job_id": str(plan.job_id)},
        ) from exc
    with unit_of_work(rt.sessions) as session:
        mark_dispatched(session, plan.job_id, utcnow())


def dispatch_job(app: Celery, rt: Runtime, job_id: uuid.UUID) -> bool:
    """(Re)publish whatever of the job is unfinished. Returns whether anything was sent."""
    with unit_of_work(rt.sessions) as session:
        plan = load_plan(session, job_id)
        if plan is not None and not plan.layers:
            settle_job(session, job_id, utcnow())
    if plan is None or not plan.layers:
        return False
    publish_plan(app, rt, plan)
    return True
