"""The periodic sweeper: re-publish what the broker lost, fail what ran past its timeout."""

import logging
import time
import uuid
from datetime import timedelta

from service.catalogue.notices import requeue_lost_notices
from service.catalogue.retention import (
    RetentionPolicy,
    prune_all,
    prune_dependency_fires,
    prune_fires,
    prune_tombstones,
)
from service.engine import sweeper
from service.engine.concurrency import let_in_all, take_turns
from service.engine.profiles import prune_profiles
from service.engine.runtime import Runtime
from service.engine.slots import let_in_steps
from service.engine.submission import mark_dispatched
from service.language.plan import JobPlan
from service.platform.audit import prune_events
from service.platform.clock import utcnow
from service.platform.constants import TASK_SWEEP
from service.platform.db import unit_of_work
from service.platform.metrics import SWEEPER_REPUBLISHED
from service.triggers.hooks import prune_deliveries
from tasks import runtime
from tasks.app import app
from tasks.broker import BrokerState, forget_loss, read_broker
from tasks.dispatch import dispatch_job, publish_or_defer
from tasks.notices import send_notice

log = logging.getLogger(__name__)

PROFILES_PRUNED_EVERY_S = 3600.0
_profiles_pruned = {"next": 0.0}
"""When this process next deletes the profiles no job names (``service.engine.profiles``)."""


@app.task(name=TASK_SWEEP, ignore_result=True)
def sweep() -> dict[str, int]:
    """A pass that found the broker emptied and fails before it has sent every open job again
    (PostgreSQL away, a publish refused) takes its marker back, so the next pass finds the
    loss again instead of leaving those jobs to stall detection, minutes later."""
    rt = runtime.get()
    settings = rt.settings
    broker = read_broker(settings.broker())
    lost = broker.lost
    try:
        report, sent = _republish(rt, broker)
    except Exception:
        if lost:
            forget_loss(settings.broker(), broker.epoch)
        raise
    sent += _resend_compensations(rt, sorted(report.compensate))
    sent += _let_in_waiting(rt)
    now = utcnow()
    resend_before = now - timedelta(seconds=settings.notify_resend_after_s)
    with unit_of_work(rt.sessions) as session:
        lost_notices = requeue_lost_notices(session, older_than=resend_before, now=now)
    for job_id in lost_notices:
        send_notice.delay(str(job_id))
    _prune_profiles(rt)
    with unit_of_work(rt.sessions) as session:
        now = utcnow()
        policy = RetentionPolicy.of(settings)
        pruned = prune_all(session, now, policy)
        prune_tombstones(session, now, policy)
        pruned_fires = prune_fires(session, now)
        prune_deliveries(session, now)
        prune_dependency_fires(session)
        pruned_events = prune_events(session, now, settings.audit_retention_days)
    if sent or report.timed_out or lost_notices:
        log.warning(
            "sweep: broker_lost=%s republished=%d timed_out=%d notices=%d",
            lost,
            sent,
            report.timed_out,
            len(lost_notices),
        )
    return {
        "republished": sent,
        "timed_out": report.timed_out,
        "notices": len(lost_notices),
        "pruned_jobs": pruned,
        "pruned_fires": pruned_fires,
        "pruned_audit_events": pruned_events,
    }


def _prune_profiles(rt: Runtime) -> None:
    """At most once an hour in this process: the pass holds off every statement that stores
    jobs while it looks for the jobs of each profile older than a day."""
    now = time.monotonic()
    if now < _profiles_pruned["next"]:
        return
    with unit_of_work(rt.sessions) as session:
        prune_profiles(session, utcnow())
    _profiles_pruned["next"] = now + PROFILES_PRUNED_EVERY_S


def _resend_compensations(rt: Runtime, job_ids: list[uuid.UUID]) -> int:
    """Each job sent is marked so, so that the next pass waits for this message to arrive."""
    sent = [job for job in job_ids if publish_or_defer(app, rt, JobPlan(job, compensate=True))]
    if sent:
        now = utcnow()
        with unit_of_work(rt.sessions) as session:
            for job_id in sent:
                mark_dispatched(session, job_id, now)
        SWEEPER_REPUBLISHED.labels("compensation_lost").inc(len(sent))
    return len(sent)


def _let_in_waiting(rt: Runtime) -> int:
    """Jobs waiting for a slot of their concurrency key that has one free, or their turn: the
    beat leader lets them in as soon as it comes; this pass is for a leader that could not."""
    ahead = rt.settings.fair_share_ahead
    with unit_of_work(rt.sessions) as session:
        admitted = let_in_all(session, utcnow())
        if ahead:
            admitted += take_turns(session, ahead, sent_at=utcnow())
        steps = let_in_steps(session, utcnow())
    for job_id in admitted:
        dispatch_job(app, rt, job_id)
    for plan in steps:
        publish_or_defer(app, rt, plan)
    if admitted or steps:
        SWEEPER_REPUBLISHED.labels("slot_free").inc(len(admitted) + len(steps))
    return len(admitted) + len(steps)


def _republish(rt: Runtime, broker: BrokerState) -> tuple[sweeper.SweepReport, int]:
    settings = rt.settings
    with unit_of_work(rt.sessions) as session:
        report = sweeper.sweep(
            session,
            now=utcnow(),
            broker_lost=broker.lost,
            stall_after_s=settings.stall_after_s,
            dispatch_grace_s=settings.dispatch_grace_s,
            oldest_waiting=broker.oldest_waiting,
            held=broker.held,
        )
    sent = 0
    for job_id in sorted(report.redispatch):
        if dispatch_job(app, rt, job_id):
            sent += 1
            SWEEPER_REPUBLISHED.labels(report.causes.get(job_id, "other")).inc()
    return report, sent
