"""How much history is kept, whether a job came from a schedule, the API, a trigger or the CLI.

A finished job is kept at least ``retention_min_age_s`` after it finished, so that a client
polling a job it was given a 202 for never finds it gone; past that age, the newest
``runs_kept_per_pipeline`` finished jobs of each owner's pipeline are kept, and, with a
``retention_max_age_days``, none older than that. Whatever the count and the age, a job a diff
still needs is kept: the newest succeeded job of each pipeline (the next run's base), the base
of every job that is kept, and the base an open job will diff against when it succeeds. Also
kept: the fire records a schedule still needs as its fence, and the dependency fences of
upstream jobs that still exist (a rerun can make one succeed again; a deleted one never will).

Steps, checkpoints, result items, rounds and logs go with a job through their foreign keys, its
event log (migration 0011) and its rows of the step cache (0047) through the trigger that
forgets a deleted job's rows: a cached output outlives no job of its own. Open jobs are never
deleted. A deleted job leaves a tombstone in ``pruned_jobs``, written by the statement that
deletes it, so that a read answers ``job_expired`` rather than ``job_not_found``.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, func, select, text, tuple_
from sqlalchemy.orm import Session

from service.platform.constants import (
    FIRE_RECORDS_KEPT_S,
    RETENTION_BATCH_ROWS,
    SWEEP_ADVISORY_LOCK_ID,
    TOMBSTONES_KEPT_S,
)
from service.platform.models import (
    DependencyFireRow,
    JobRow,
    PrunedJobRow,
    ScheduleFireRow,
    ScheduleRow,
)
from service.platform.settings import Settings
from service.platform.states import JOB_FINAL, JOB_OPEN, JobStatus


@dataclass(frozen=True)
class RetentionPolicy:
    keep: int
    min_age_s: float
    max_age_days: float | None = None

    @classmethod
    def of(cls, settings: Settings) -> "RetentionPolicy":
        return cls(
            keep=settings.runs_kept_per_pipeline,
            min_age_s=settings.retention_min_age_s,
            max_age_days=settings.retention_max_age_days,
        )

    def tombstones_kept_s(self) -> float:
        """A tombstone lives as long as a job may, so a client that polls a job for as long as
        it could have lived still learns it expired; without an age limit, a fixed period."""
        if self.max_age_days is None:
            return TOMBSTONES_KEPT_S
        return self.max_age_days * 86_400


# ``old``: finished jobs past the minimum age, the only ones count and age apply to.
# ``pipes``: the pipelines that have some. ``bound``: for each, the newest finished job beyond
# the count; it and everything older is beyond the count.
# ``expired``: the old jobs beyond the count or the maximum age.
# ``needed``: what a diff needs: the newest success of each pipeline (and the newest with
# items, which the next run diffs against), the base of each open job when it succeeds, and
# the stored base of each job that stays. A job whose base is itself expired does not keep it.
# Each is an index lookup per pipeline, per open job or per expired job, never a walk of a
# pipeline's history per candidate.
_PRUNE = """
    WITH old AS MATERIALIZED (
        SELECT id, owner, pipeline, created_at, finished_at
          FROM jobs
         WHERE finished_at < :min_cutoff AND status IN {final}
           {scope}
    ),
    pipes AS MATERIALIZED (SELECT DISTINCT owner, pipeline FROM old),
    bound AS (
        SELECT p.owner, p.pipeline, b.created_at, b.id
          FROM pipes AS p
          CROSS JOIN LATERAL (
              SELECT n.created_at, n.id FROM jobs AS n
               WHERE n.owner = p.owner AND n.pipeline = p.pipeline
                 AND n.status IN {final}
               ORDER BY n.created_at DESC, n.id DESC
              OFFSET :keep LIMIT 1
          ) AS b
    ),
    expired AS MATERIALIZED (
        SELECT o.id, o.finished_at FROM old AS o LEFT JOIN bound AS b USING (owner, pipeline)
         WHERE o.finished_at < CAST(:max_cutoff AS timestamptz)
            OR (o.created_at, o.id) <= (b.created_at, b.id)
    ),
    needed AS (
        SELECT s.id FROM pipes AS p
          CROSS JOIN LATERAL (
              SELECT n.id FROM jobs AS n
               WHERE n.owner = p.owner AND n.pipeline = p.pipeline AND n.status = {succeeded}
               ORDER BY n.created_at DESC, n.id DESC LIMIT 1
          ) AS s
        UNION
        SELECT s.id FROM pipes AS p
          CROSS JOIN LATERAL (
              SELECT n.id FROM jobs AS n
               WHERE n.owner = p.owner AND n.pipeline = p.pipeline AND n.status = {succeeded}
                 AND n.item_count IS NOT NULL
               ORDER BY n.created_at DESC, n.id DESC LIMIT 1
          ) AS s
        UNION
        SELECT s.id FROM jobs AS k
          CROSS JOIN LATERAL (
              SELECT n.id FROM jobs AS n
               WHERE n.owner = k.owner AND n.pipeline = k.pipeline AND n.status = {succeeded}
                 AND n.item_count IS NOT NULL AND (n.created_at, n.id) < (k.created_at, k.id)
               ORDER BY n.created_at DESC, n.id DESC LIMIT 1
          ) AS s
         WHERE k.status IN {open}
           {open_scope}
        UNION
        SELECT k.previous_job_id FROM jobs AS k
         WHERE k.previous_job_id IN (SELECT id FROM expired)
           AND k.id NOT IN (SELECT id FROM expired)
    ),
    doomed AS (
        SELECT e.id FROM expired AS e
         WHERE e.id NOT IN (SELECT id FROM needed WHERE id IS NOT NULL)
         ORDER BY e.finished_at, e.id
         LIMIT :batch
    ),
    gone AS (
        DELETE FROM jobs WHERE id IN (SELECT id FROM doomed)
        RETURNING id, owner, pipeline, finished_at
    )
    INSERT INTO pruned_jobs (job_id, owner, pipeline, finished_at, pruned_at)
    SELECT id, owner, pipeline, finished_at, :now FROM gone
    ON CONFLICT (job_id) DO NOTHING
    RETURNING job_id
"""


def _sql_list(statuses: Iterable[str]) -> str:
    return "(" + ", ".join(f"'{status}'" for status in sorted(statuses)) + ")"


_STATUSES = {
    "final": _sql_list(JOB_FINAL),
    "open": _sql_list(JOB_OPEN),
    "succeeded": f"'{JobStatus.SUCCEEDED}'",
}
_PRUNE_ALL = text(_PRUNE.format(scope="", open_scope="", **_STATUSES))
_PRUNE_PIPELINE = text(
    _PRUNE.format(
        scope="AND owner = :owner AND pipeline = :pipeline",
        open_scope="AND k.owner = :owner AND k.pipeline = :pipeline",
        **_STATUSES,
    )
)


def _prune(
    session: Session,
    now: datetime,
    policy: RetentionPolicy,
    *,
    batch: int,
    owner: str | None = None,
    pipeline: str | None = None,
) -> int:
    """One statement deletes and leaves the tombstones, so no reader ever finds a job neither
    there nor expired. The planner's estimates of the lateral lookups are far above what they
    cost, enough to compile the statement on every pass (about 100 ms of JIT on 20,000 jobs
    for a statement that runs in 50): JIT is off for this transaction."""
    session.execute(text("SET LOCAL jit = off"))
    max_cutoff = None
    if policy.max_age_days is not None:
        max_cutoff = now - timedelta(days=policy.max_age_days)
    pruned = session.scalars(
        _PRUNE_ALL if owner is None else _PRUNE_PIPELINE,
        {
            "now": now,
            "min_cutoff": now - timedelta(seconds=policy.min_age_s),
            "max_cutoff": max_cutoff,
            "keep": policy.keep,
            "batch": batch,
            "owner": owner,
            "pipeline": pipeline,
        },
    )
    return len(pruned.all())


def prune_runs(
    session: Session,
    now: datetime,
    policy: RetentionPolicy,
    *,
    owner: str,
    pipeline: str,
    batch: int = RETENTION_BATCH_ROWS,
) -> int:
    """Prune one owner's pipeline, as the beat does after firing it."""
    return _prune(session, now, policy, batch=batch, owner=owner, pipeline=pipeline)


def prune_all(
    session: Session, now: datetime, policy: RetentionPolicy, *, batch: int = RETENTION_BATCH_ROWS
) -> int:
    """Delete up to ``batch`` finished jobs of every pipeline that the policy no longer keeps.

    One pass at a time, under the sweeper's advisory lock, so two beat replicas never race
    over the same rows; a pass that finds more than ``batch`` leaves the rest to the next one.
    """
    if not session.scalar(select(func.pg_try_advisory_xact_lock(SWEEP_ADVISORY_LOCK_ID))):
        return 0
    return _prune(session, now, policy, batch=batch)


def prune_tombstones(
    session: Session, now: datetime, policy: RetentionPolicy, *, batch: int = RETENTION_BATCH_ROWS
) -> int:
    """Delete the tombstones of jobs pruned longer ago than the policy keeps them."""
    cutoff = now - timedelta(seconds=policy.tombstones_kept_s())
    doomed = (
        select(PrunedJobRow.job_id)
        .where(PrunedJobRow.pruned_at < cutoff)
        .order_by(PrunedJobRow.pruned_at)
        .limit(batch)
    )
    deleted = session.scalars(
        delete(PrunedJobRow).where(PrunedJobRow.job_id.in_(doomed)).returning(PrunedJobRow.job_id)
    )
    return len(deleted.all())


def prune_fires(session: Session, now: datetime, *, batch: int = RETENTION_BATCH_ROWS) -> int:
    """Delete fire records that can no longer fence anything: older than their schedule's
    catch-up window (no replica fires that far back) plus ``FIRE_RECORDS_KEPT_S``. A
    backfill's records are its progress and go with the backfill."""
    window = func.make_interval(0, 0, 0, 0, 0, 0, ScheduleRow.catchup_window_s)
    doomed = (
        select(ScheduleFireRow.id)
        .join(ScheduleRow, ScheduleRow.id == ScheduleFireRow.schedule_id)
        .where(
            ScheduleFireRow.fire_at < now - timedelta(seconds=FIRE_RECORDS_KEPT_S) - window,
            ScheduleFireRow.backfill_id.is_(None),
        )
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
