"""How much history is kept: the newest ``runs_kept_per_pipeline`` finished jobs of each
owner's pipeline, whether its jobs come from a schedule, the API, a trigger or the CLI, the
fire records a schedule still needs as its fence, and the dependency fences of upstream jobs that
still exist (a rerun can make one succeed again; a deleted one never will).

Steps, checkpoints, result items and rounds go with a job through their foreign keys, its
event log through the trigger of migration 0011. Open jobs are never deleted.
"""

from datetime import datetime, timedelta

from sqlalchemy import and_, delete, func, select, tuple_
from sqlalchemy.orm import Session

from service.constants import FIRE_RECORDS_KEPT_S, RETENTION_BATCH_ROWS, SWEEP_ADVISORY_LOCK_ID
from service.models import DependencyFireRow, JobRow, ScheduleFireRow, ScheduleRow
from service.states import JOB_FINAL

FINAL_STATUSES = tuple(status.value for status in JOB_FINAL)


def prune_runs(session: Session, *, owner: str, pipeline: str, keep: int) -> int:
    """Delete finished jobs of one pipeline beyond its newest ``keep``."""
    ranked = (
        select(
            JobRow.id,
            JobRow.status,
            func.row_number()
            .over(order_by=(JobRow.created_at.desc(), JobRow.id.desc()))
            .label("rank"),
        )
        .where(JobRow.owner == owner, JobRow.pipeline == pipeline)
        .subquery()
    )
    doomed = select(ranked.c.id).where(
        and_(ranked.c.rank > keep, ranked.c.status.in_(FINAL_STATUSES))
    )
    deleted = session.scalars(delete(JobRow).where(JobRow.id.in_(doomed)).returning(JobRow.id))
    return len(deleted.all())


def prune_all(session: Session, *, keep: int, batch: int = RETENTION_BATCH_ROWS) -> int:
    """Delete up to ``batch`` finished jobs beyond the newest ``keep`` of every pipeline.

    One pass at a time, under the sweeper's advisory lock, so two beat replicas never race
    over the same rows; a pass that finds more than ``batch`` leaves the rest to the next one.
    """
    if not session.scalar(select(func.pg_try_advisory_xact_lock(SWEEP_ADVISORY_LOCK_ID))):
        return 0
    ranked = select(
        JobRow.id,
        JobRow.status,
        func.row_number()
        .over(
            partition_by=(JobRow.owner, JobRow.pipeline),
            order_by=(JobRow.created_at.desc(), JobRow.id.desc()),
        )
        .label("rank"),
    ).subquery()
    doomed = (
        select(ranked.c.id)
        .where(ranked.c.rank > keep, ranked.c.status.in_(FINAL_STATUSES))
        .limit(batch)
    )
    deleted = session.scalars(delete(JobRow).where(JobRow.id.in_(doomed)).returning(JobRow.id))
    return len(deleted.all())


def prune_fires(session: Session, now: datetime, *, batch: int = RETENTION_BATCH_ROWS) -> int:
    """Delete fire records that can no longer fence anything: older than their schedule's
    catch-up window (no replica fires that far back) plus ``FIRE_RECORDS_KEPT_S``."""
    window = func.make_interval(0, 0, 0, 0, 0, 0, ScheduleRow.catchup_window_s)
    doomed = (
        select(ScheduleFireRow.id)
        .join(ScheduleRow, ScheduleRow.id == ScheduleFireRow.schedule_id)
        .where(ScheduleFireRow.fire_at < now - timedelta(seconds=FIRE_RECORDS_KEPT_S) - window)
        .limit(batch)
    )
    deleted = session.scalars(
        delete(ScheduleFireRow).where(ScheduleFireRow.id.in_(doomed)).returning(ScheduleFireRow.id)
    )
    return len(deleted.all())


def prune_dependency_fires(session: Session, *, batch: int = RETENTION_BATCH_ROWS) -> int:
    """Delete the fences of upstream jobs that are gone."""
    doomed = (
        select(DependencyFireRow.upstream_job_id, DependencyFireRow.downstream)
        .where(~select(JobRow.id).where(JobRow.id == DependencyFireRow.upstream_job_id).exists())
        .limit(batch)
    )
    deleted = session.execute(
        delete(DependencyFireRow)
        .where(tuple_(DependencyFireRow.upstream_job_id, DependencyFireRow.downstream).in_(doomed))
        .returning(DependencyFireRow.upstream_job_id)
    )
    return len(deleted.all())
