"""Counts an operator watches, read from PostgreSQL when metrics are scraped."""

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.platform.models import JobRow, StepRunRow
from service.platform.states import STEP_FINAL, JobStatus, StepStatus


def jobs_by_status(session: Session) -> dict[str, int]:
    counts = {status.value: 0 for status in JobStatus}
    rows = session.execute(select(JobRow.status, func.count()).group_by(JobRow.status))
    counts.update({status: count for status, count in rows})
    return counts


def steps_by_open_status(session: Session) -> dict[str, int]:
    """Open steps and shards only; settled ones are history, counted through their jobs."""
    open_statuses = [s for s in StepStatus if s not in STEP_FINAL]
    counts = {status.value: 0 for status in open_statuses}
    rows = session.execute(
        select(StepRunRow.status, func.count())
        .where(StepRunRow.status.in_(open_statuses))
        .group_by(StepRunRow.status)
    )
    counts.update({status: count for status, count in rows})
    return counts
