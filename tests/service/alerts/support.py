"""Rules and failed jobs on the test stack, for the alert tests."""

import uuid
from typing import Any

from sqlalchemy import select, update

from service.alerts.rules import SavedRule, put_rule
from service.engine.runtime import Runtime
from service.platform.db import unit_of_work
from service.platform.models import AlertDeliveryRow, JobRow
from service.platform.settings import AlertRuleBody, Settings
from tests.support.arrange import walk
from tests.support.fanouts import submitted

SECRET_NAME = "ALERT_KEY"
SECRET = "alert-signing-secret"
URL = "http://127.0.0.1:9/alerts"


def one_step(name: str = "alerted") -> dict[str, Any]:
    return {"name": name, "steps": [{"id": "only", "action": "noop"}]}


def rule(
    rt: Runtime,
    owner: str,
    name: str = "on-failure",
    settings: Settings | None = None,
    **body: Any,
) -> SavedRule:
    fields = {"kind": "job_failed", "url": URL, "secret": SECRET_NAME, **body}
    with unit_of_work(rt.sessions) as session:
        saved = put_rule(
            session, name, AlertRuleBody(**fields), owner=owner, settings=settings or rt.settings
        )
        session.expunge(saved.rule)
        return saved


def failed_job(rt: Runtime, profile: dict[str, Any] | None = None, *, code: str = "boom") -> JobRow:
    """A job of a fresh owner, failed with error ``code``; its ``job.failed`` event commits
    with it."""
    job_id = submitted(rt, profile or one_step(), {})
    fail(rt, job_id, code=code)
    with unit_of_work(rt.sessions) as session:
        job = session.get(JobRow, job_id)
        assert job is not None
        session.expunge(job)
        return job


def fail(rt: Runtime, job_id: uuid.UUID, *, code: str = "boom") -> None:
    error = {"code": code, "message": f"{code} happened", "details": {}}
    with unit_of_work(rt.sessions) as session:
        session.execute(update(JobRow).where(JobRow.id == job_id).values(error=error))
        walk(session, JobRow, JobRow.id == job_id, to="failed")


def outbox(rt: Runtime, rule_id: uuid.UUID) -> list[AlertDeliveryRow]:
    with unit_of_work(rt.sessions) as session:
        rows = list(
            session.scalars(
                select(AlertDeliveryRow)
                .where(AlertDeliveryRow.rule_id == rule_id)
                .order_by(AlertDeliveryRow.id)
            )
        )
        session.expunge_all()
        return rows
