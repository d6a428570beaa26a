"""The beat leader's part in alerts, every ``alerts_interval_s``: write ``FLOWBEAT_ALERTS``
into PostgreSQL once it leads, match new events and lasting conditions into the outbox, prune
old deliveries, and queue the task that sends what is due. A broker that is away loses
nothing: the rows wait in PostgreSQL and the next pass queues the task again."""

import logging
import time
from datetime import datetime, timedelta

import redis
from kombu.exceptions import OperationalError as KombuOperationalError
from redis.exceptions import RedisError

from service.alerts.conditions import check_queues, check_schedules, wants_queue_ages
from service.alerts.matching import match_events
from service.alerts.offers import Offered
from service.alerts.rules import sync_settings_rules
from service.alerts.sending import has_due, prune_deliveries
from service.engine.runtime import Runtime
from service.platform.db import unit_of_work
from service.platform.settings import Settings
from tasks.alerts import send_alerts
from tasks.broker import queue_states

log = logging.getLogger(__name__)

MATCH_BATCHES = 10
"""Batches of the event log one pass reads at most, each in its own transaction, so a busy log
is caught up with in a few passes without one transaction growing with it."""


class AlertWatch:
    def __init__(self, settings: Settings, runtime: Runtime, broker: redis.Redis) -> None:
        self.settings = settings
        self.runtime = runtime
        self.broker = broker
        self.synced = False
        self.last_pass = float("-inf")

    def tick(self, now: datetime) -> None:
        if time.monotonic() - self.last_pass < self.settings.alerts_interval_s:
            return
        self.last_pass = time.monotonic()
        sessions = self.runtime.sessions
        if not self.synced:
            with unit_of_work(sessions) as session:
                for refused in sync_settings_rules(session, self.settings):
                    log.error("alerts: %s", refused.message)
            self.synced = True
        offered = Offered(more=True)
        for _ in range(MATCH_BATCHES):
            if not offered.more:
                break
            with unit_of_work(sessions) as session:
                batch = match_events(session, now)
            offered.add(batch)
            offered.more = batch.more
        with unit_of_work(sessions) as session:
            offered.add(check_schedules(session, now))
            if wants_queue_ages(session):
                offered.add(check_queues(session, self._oldest(), now))
        if offered.queued or offered.suppressed:
            log.info("alerts: %d queued, %d held back", offered.queued, offered.suppressed)
        with unit_of_work(sessions) as session:
            prune_deliveries(session, now - timedelta(days=self.settings.alerts_kept_days))
            due = has_due(session, now)
        if due:
            try:
                send_alerts.delay()
            except (KombuOperationalError, RedisError, OSError) as exc:
                log.warning("alerts: could not queue the sender, next pass tries again: %s", exc)

    def _oldest(self) -> dict[str, datetime | None]:
        try:
            states = queue_states(self.broker, self.settings.worker_dead_after_s)
        except RedisError as exc:
            log.warning("alerts: queues unreadable: %s", exc)
            return {}
        return {state.name: state.oldest_sent for state in states}
