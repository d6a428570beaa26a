"""``celery beat -S scheduler.beat:FlowbeatScheduler``: schedules from PostgreSQL, one leader.

Every replica ticks; only the holder of the Redis leader lock does work. The leader runs the
static entries of ``beat_schedule`` (the sweeper), fires due schedules from PostgreSQL, cancels
scheduled runs past their timeout, tops up running backfills (``service.triggers.backfills``),
times out approvals and signal waits, fails jobs past their deadline, wakes wait steps whose
time has come (``service.engine.waits``), starts and settles sub-pipelines
(``service.engine.children``), lets in what waits for a slot or a turn, matches alert rules
(``scheduler.alerting``), and prunes old runs. Schedules are read on every tick, and the
leader spends the time between ticks listening for saved schedules and backfills
(``scheduler.wakeups``), so a change through the API applies at once, without a restart. The
lock only keeps standbys idle: exactly-once per fire comes from the ``schedule_fires`` fence in
PostgreSQL, for a backfill's fires as for the schedule's own.
"""

import logging
import uuid
from collections.abc import Iterable
from datetime import datetime
from functools import cached_property
from typing import Any

from celery import beat
from kombu.exceptions import OperationalError as KombuOperationalError
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError

from scheduler.alerting import AlertWatch
from scheduler.lock import LeaderLock, make_token
from scheduler.wakeups import ScheduleWakeups
from service.catalogue.retention import RetentionPolicy, prune_runs
from service.engine.approvals import expire_due
from service.engine.children import Starter, advance_children, next_retry
from service.engine.concurrency import let_in_all, take_turns, waiting_turns
from service.engine.deadlines import EXPIRE_BATCH, expire_deadlines, next_deadline
from service.engine.rates import next_rate_wake, wake_due_rates
from service.engine.runtime import Runtime
from service.engine.signals import expire_waits, next_signal_due, resume_signalled
from service.engine.slots import let_in_steps, steps_waiting
from service.engine.waits import next_wake, wake_due
from service.language.plan import JobPlan
from service.platform import ratelimit, tracing
from service.platform.brokers import redis_client
from service.platform.clock import utcnow
from service.platform.constants import BEAT_LOCK_KEY, LEADER_POLL_S
from service.platform.db import unit_of_work
from service.platform.errors import BrokerUnavailable
from service.platform.metrics import BEAT_FIRE_LAG, BEAT_LEADER_CHANGES
from service.platform.settings import Settings, get_settings
from service.triggers.backfills import running_ids as backfill_ids
from service.triggers.backfills import top_up
from service.triggers.dependencies import fire_dependents
from service.triggers.firing import (
    TickResult,
    cancel_overdue,
    due_schedule_ids,
    fire_schedule,
    next_wakeup,
)
from tasks.approvals import send_escalation
from tasks.dispatch import dispatch_job, publish_or_defer, revoke_unstarted, send_new_job

log = logging.getLogger(__name__)

MIN_SLEEP_S = 0.05
TURN_POLL_S = 0.2
"""How soon the leader looks again while jobs wait their turn (fair share)."""


class FlowbeatScheduler(beat.Scheduler):  # type: ignore[misc]
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.settings: Settings = get_settings()
        self.tick_s = max(MIN_SLEEP_S, self.settings.beat_lock_ttl_s / 3)
        client = redis_client(self.settings.broker(), socket_timeout=self.tick_s)
        self.lock = LeaderLock(client, BEAT_LOCK_KEY, self.settings.beat_lock_ttl_s, make_token())
        self.broker = client
        self.wakeups = ScheduleWakeups(self.settings.listen_url())
        super().__init__(*args, **kwargs)

    @cached_property
    def runtime(self) -> Runtime:
        return Runtime.start(self.settings, pool_size=2)

    @cached_property
    def alerts(self) -> AlertWatch:
        return AlertWatch(self.settings, self.runtime, self.broker)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One tick; the leader then waits here for its next one or a saved schedule, whichever
        comes first, and returns 0 so celery beat ticks again at once. A leader that cannot
        listen, and every standby, return their sleep for celery beat to sleep."""
        was_leader = self.lock.held
        try:
            leader = self.lock.hold()
        except RedisError as exc:
            log.warning("beat: leader lock unreachable: %s", exc)
            self.lock.held = False
            leader = False
        if leader != was_leader:
            log.info("beat: %s leader (%s)", "became" if leader else "no longer", self.lock.token)
            BEAT_LEADER_CHANGES.labels("gained" if leader else "lost").inc()
        if not leader:
            self.wakeups.close()
            return self.tick_s
        self.wakeups.listen()
        static_s = float(super().tick(*args, **kwargs))
        try:
            fire_s = self.fire_due(utcnow())
        except SQLAlchemyError as exc:
            log.warning("beat: database unavailable, retrying next tick: %s", exc)
            fire_s = self.tick_s
        sleep_s = max(MIN_SLEEP_S, min(static_s, fire_s, self.tick_s, LEADER_POLL_S))
        return sleep_s if self.wakeups.wait(sleep_s) is None else 0.0

    def fire_due(self, now: datetime) -> float:
        """Fire every due schedule; returns the seconds until the next fire.

        Zero when a schedule fell due while this tick ran, so it fires without waiting a tick.
        """
        settings = self.settings
        sessions = self.runtime.sessions
        with unit_of_work(sessions) as session:
            due = due_schedule_ids(session, now)
        held: dict[uuid.UUID, datetime] = {}
        for schedule_id in due:
            with tracing.span("schedule.fire", schedule_id=str(schedule_id)):
                with unit_of_work(sessions) as session:
                    result = fire_schedule(
                        session,
                        schedule_id,
                        now=now,
                        grace_s=3 * settings.beat_lock_ttl_s,
                        profiles_dir=settings.profiles_dir,
                        known_actions=self.runtime.registry.names(),
                    )
                self.send(result)
            if result.held_until is not None:
                held[schedule_id] = result.held_until
        with unit_of_work(sessions) as session:
            overdue = cancel_overdue(session, now=now, timeout_s=settings.schedule_run_timeout_s)
        self.revoke(overdue.revoke)
        self.compensate(overdue.compensate)
        self.top_up_backfills(now)
        self.expire_approvals(now)
        self.expire_signal_waits(now)
        self.expire_deadlines(now)
        self.wake_sleepers(now)
        self.let_in_rate_waits(now)
        self.advance_children(now)
        self.fire_dependents()
        turns_waiting = self.let_in_waiting(now)
        self.alerts.tick(now)
        with unit_of_work(sessions) as session:
            wake = next_wakeup(session, held=held.keys())
            deadline = next_deadline(session)
            sleeper = next_wake(session)
            signal_due = next_signal_due(session)
            retry = next_retry(session)
            rate = next_rate_wake(session)
        timers = (wake, deadline, sleeper, signal_due, retry, rate, *held.values())
        wakes = [w for w in timers if w is not None]
        if not wakes:
            return TURN_POLL_S if turns_waiting else self.tick_s
        until = max(0.0, (min(wakes) - utcnow()).total_seconds())
        return min(until, TURN_POLL_S) if turns_waiting else until

    def send(self, result: TickResult) -> None:
        """After the commit: publish new jobs, revoke cancelled tasks, send the compensations
        of cancelled sagas, prune old runs."""
        for job in result.jobs:
            try:
                send_new_job(self.app, self.runtime, job)
            except BrokerUnavailable:
                log.warning(
                    "beat: job %s stored; the sweeper sends it when the broker is back", job.id
                )
            log.info("beat: fired %s for %s as job %s", job.pipeline, job.scheduled_for, job.id)
            if job.scheduled_for is not None:
                BEAT_FIRE_LAG.observe(max(0.0, (utcnow() - job.scheduled_for).total_seconds()))
        self.revoke(result.revoke)
        self.compensate(result.compensate)
        policy = RetentionPolicy.of(self.settings)
        for owner, pipeline in {(job.owner, job.pipeline) for job in result.jobs}:
            with unit_of_work(self.runtime.sessions) as session:
                prune_runs(session, utcnow(), policy, owner=owner, pipeline=pipeline)

    def top_up_backfills(self, now: datetime) -> None:
        """Start the next fires of each running backfill while it has room under its
        ``max_active``, one backfill per transaction; the jobs are sent after its commit. A
        job of a backfill that ends makes room that the next tick fills."""
        with unit_of_work(self.runtime.sessions) as session:
            running = backfill_ids(session)
        for backfill_id in running:
            with unit_of_work(self.runtime.sessions) as session:
                started = top_up(
                    session,
                    backfill_id,
                    profiles_dir=self.settings.profiles_dir,
                    known_actions=self.runtime.registry.names(),
                    now=now,
                )
            for job in started.jobs:
                try:
                    send_new_job(self.app, self.runtime, job)
                except BrokerUnavailable:
                    log.warning("beat: backfill job %s stored; the sweeper sends it", job.id)
                log.info(
                    "beat: backfill %s started %s as job %s", backfill_id, job.scheduled_for, job.id
                )

    def fire_dependents(self) -> None:
        """Start the jobs that queued successes wait for (dependency triggers); they are sent
        after the commit, and a job whose message is lost is the sweeper's, as any."""
        with unit_of_work(self.runtime.sessions) as session:
            started = fire_dependents(
                session,
                profiles_dir=self.settings.profiles_dir,
                known_actions=self.runtime.registry.names(),
            )
        for job in started:
            try:
                send_new_job(self.app, self.runtime, job)
            except BrokerUnavailable:
                log.warning("beat: job %s stored; the sweeper sends it later", job.id)
            log.info(
                "beat: job %s of %s started by job %s", job.id, job.pipeline, job.parent_job_id
            )

    def let_in_waiting(self, now: datetime) -> bool:
        """Jobs waiting for a slot of their concurrency key that has one free now (a keyed job
        that ended, or a waiting one stored, woke this leader: migration 0025), those whose
        turn came (fair share), and steps whose key has a slot free (a step of the key that
        stopped running woke it: migration 0028); whether any still wait for a turn or a
        step slot, for the leader to look again soon, since a job taken by a worker makes room
        for the next and a killed worker's lease lapses without waking anyone."""
        ahead = self.settings.fair_share_ahead
        with unit_of_work(self.runtime.sessions) as session:
            admitted = let_in_all(session, now)
            if ahead:
                admitted += take_turns(session, ahead, sent_at=now)
            steps = let_in_steps(session, now)
            waiting = (bool(ahead) and waiting_turns(session)) or steps_waiting(session)
        for plan in steps:
            publish_or_defer(self.app, self.runtime, plan)
        for job_id in admitted:
            try:
                dispatch_job(self.app, self.runtime, job_id)
            except BrokerUnavailable:
                log.warning("beat: job %s let in; the sweeper sends it later", job_id)
        return waiting

    def expire_approvals(self, now: datetime) -> None:
        """Approvals past due get their timeout action here, on the elected replica, rather
        than in a task sleeping on a worker; what they make ready is sent after the commit."""
        with unit_of_work(self.runtime.sessions) as session:
            expired = expire_due(session, now)
        for plan in expired.ready:
            publish_or_defer(self.app, self.runtime, plan)
        for job_id, step_id in expired.escalated:
            try:
                send_escalation.delay(str(job_id), step_id)
            except (KombuOperationalError, RedisError, OSError) as exc:
                log.warning(
                    "beat: could not queue the escalation of %s/%s: %s", job_id, step_id, exc
                )

    def expire_signal_waits(self, now: datetime) -> None:
        """Steps parked for a signal: sent on when their signal is stored (a park and a signal
        that crossed), or given their ``on_timeout`` once it is due; sent after the commit."""
        with unit_of_work(self.runtime.sessions) as session:
            ready = resume_signalled(session) + expire_waits(session, now)
        for plan in ready:
            publish_or_defer(self.app, self.runtime, plan)

    def expire_deadlines(self, now: datetime) -> None:
        """Fail the jobs past their deadline, a batch per transaction until none is left, then
        revoke their running tasks and send their compensations after each commit."""
        while True:
            with unit_of_work(self.runtime.sessions) as session:
                expired = expire_deadlines(session, now)
            for job_id in expired.failed:
                log.info("beat: job %s failed: past its deadline", job_id)
            self.revoke(expired.revoke)
            self.compensate(expired.compensate)
            if len(expired.failed) < EXPIRE_BATCH:
                return

    def wake_sleepers(self, now: datetime) -> None:
        """Wait steps whose time has come succeed here, on the elected replica, as approvals
        time out; what they make ready is sent after the commit, or by the sweeper once the
        broker is back."""
        with unit_of_work(self.runtime.sessions) as session:
            ready = wake_due(session, now)
        for plan in ready:
            publish_or_defer(self.app, self.runtime, plan)

    def let_in_rate_waits(self, now: datetime) -> None:
        """Steps parked for a rate limit whose window is due to have room: as many as it has
        room for go back to pending and out after the commit (``service.engine.rates``)."""
        client = ratelimit.redis_client(self.settings.broker())
        try:
            with unit_of_work(self.runtime.sessions) as session:
                ready = wake_due_rates(session, client, now)
        except RedisError as exc:
            log.warning("beat: cannot look at the rate windows, steps wait a tick: %s", exc)
            return
        for plan in ready:
            publish_or_defer(self.app, self.runtime, plan)

    def advance_children(self, now: datetime) -> None:
        """Sub-pipelines: send the steps whose backoff after a failed child is over, start the
        children that pipeline.run steps recorded, settle the steps whose child ended, cancel
        the children of jobs that ended badly; what that starts, makes ready, revokes or
        compensates goes out after the commit."""
        starter = Starter(
            self.settings.profiles_dir,
            self.runtime.registry.names(),
            self.settings.max_pipeline_depth,
        )
        with unit_of_work(self.runtime.sessions) as session:
            work = advance_children(session, now, starter)
        for job in work.started:
            try:
                send_new_job(self.app, self.runtime, job)
            except BrokerUnavailable:
                log.warning("beat: child job %s stored; the sweeper sends it later", job.id)
        for plan in work.ready:
            publish_or_defer(self.app, self.runtime, plan)
        self.revoke(work.revoke)
        self.compensate(work.compensate)

    def compensate(self, job_ids: Iterable[uuid.UUID]) -> None:
        """With the broker away, the sweeper sends them once it is back."""
        for job_id in job_ids:
            publish_or_defer(self.app, self.runtime, JobPlan(job_id, compensate=True))

    def revoke(self, task_ids: Iterable[str]) -> None:
        revoke_unstarted(self.app, list(task_ids))

    def close(self) -> None:
        self.wakeups.close()
        try:
            self.lock.release()
        except RedisError as exc:
            log.warning("beat: could not release the leader lock: %s", exc)
        super().close()
