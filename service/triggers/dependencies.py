"""Dependency triggers: a saved pipeline with ``on: {succeeded: [other]}`` runs once for each
success of its owner's ``other`` jobs; with ``on: {new_items: [other]}``, once for each success
that found result items its previous successful run did not have (``service.catalogue.diffs``).

Saving a pipeline records its triggers (``service.catalogue.trigger_edges``). A success is
queued by the database in the transaction that records it (migration 0015), and
``fire_dependents`` turns each queued success into one job per waiting pipeline, fenced by
(upstream job, downstream pipeline), then drops it from the queue, all in one transaction: run
twice, or by two beat replicas at once, it creates each job once.
"""

import logging
import uuid
from collections.abc import Collection
from pathlib import Path
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from service.catalogue.diffs import DiffKind, diff_page
from service.engine.submission import JobRequest, Outcome, submit_job
from service.platform.constants import (
    DEPENDENCY_BATCH,
    DEPENDENCY_NEW_ITEMS_MAX,
    TRIGGER_DEPENDENCY,
    TRIGGER_ON_NEW_ITEMS,
)
from service.platform.errors import FlowbeatError
from service.platform.models import (
    DependencyFireRow,
    DependencyQueueRow,
    JobRow,
    PipelineTriggerRow,
)

log = logging.getLogger(__name__)


def fire_dependents(
    session: Session, *, profiles_dir: Path | None, known_actions: Collection[str]
) -> list[JobRow]:
    """Start the jobs that queued successes wait for; returns them, to send after the commit.

    A downstream pipeline that cannot start (deleted since, or its params no longer fit) is
    fenced with no job rather than retried forever.
    """
    queued = session.scalars(
        select(DependencyQueueRow.upstream_job_id)
        .order_by(DependencyQueueRow.queued_at)
        .limit(DEPENDENCY_BATCH)
        .with_for_update(skip_locked=True)
    ).all()
    started: list[JobRow] = []
    for upstream_id in queued:
        upstream = session.get(JobRow, upstream_id)
        if upstream is not None:
            started.extend(_fire(session, upstream, profiles_dir, known_actions))
        session.execute(
            delete(DependencyQueueRow).where(DependencyQueueRow.upstream_job_id == upstream_id)
        )
    session.flush()
    return started


def _fire(
    session: Session,
    upstream: JobRow,
    profiles_dir: Path | None,
    known_actions: Collection[str],
) -> list[JobRow]:
    """The downstream jobs of one success, started in the pipelines' name order: two
    transactions firing at once, or one and a batch of the API's, take the locks of their
    dedupe keys in one order."""
    waiting = session.execute(
        select(PipelineTriggerRow.downstream, PipelineTriggerRow.kind)
        .where(
            PipelineTriggerRow.owner == upstream.owner,
            PipelineTriggerRow.upstream == upstream.pipeline,
        )
        .order_by(PipelineTriggerRow.downstream)
    ).all()
    has_new = bool(upstream.new_count)
    started = []
    for downstream, kind in waiting:
        if kind == TRIGGER_ON_NEW_ITEMS and not has_new:
            continue
        fenced = session.execute(
            pg_insert(DependencyFireRow)
            .values(upstream_job_id=upstream.id, downstream=downstream)
            .on_conflict_do_nothing()
            .returning(DependencyFireRow.downstream)
        ).first()
        if fenced is None:
            continue
        job = _start(session, upstream, downstream, profiles_dir, known_actions)
        if job is not None:
            started.append(job)
    return started


def _start(
    session: Session,
    upstream: JobRow,
    downstream: str,
    profiles_dir: Path | None,
    known_actions: Collection[str],
) -> JobRow | None:
    request = JobRequest(
        pipeline=downstream,
        params={},
        trigger=TRIGGER_DEPENDENCY,
        parent_job_id=upstream.id,
    )
    try:
        with session.begin_nested():
            job, outcome = submit_job(
                session,
                request,
                owner=upstream.owner,
                profiles_dir=profiles_dir,
                known_actions=known_actions,
            )
    except FlowbeatError as exc:
        log.warning(
            "%s did not start after job %s: %s %s", downstream, upstream.id, exc.code, exc.message
        )
        return None
    if outcome is not Outcome.NEW:
        log.info("%s after job %s duplicates job %s", downstream, upstream.id, job.id)
        _fired(session, upstream.id, downstream, job.id)
        return None
    data = trigger_data(upstream.id, upstream.result, _new_items(session, upstream))
    session.execute(update(JobRow).where(JobRow.id == job.id).values(trigger_data=data))
    job.trigger_data = data
    _fired(session, upstream.id, downstream, job.id)
    return job


def _fired(session: Session, upstream_id: uuid.UUID, downstream: str, job_id: uuid.UUID) -> None:
    """The fence row names the job the fire came to: its own, or the one it duplicates."""
    session.execute(
        update(DependencyFireRow)
        .where(
            DependencyFireRow.upstream_job_id == upstream_id,
            DependencyFireRow.downstream == downstream,
        )
        .values(job_id=job_id)
    )


def _new_items(session: Session, upstream: JobRow) -> list[Any]:
    if not upstream.new_count:
        return []
    return diff_page(session, upstream, DiffKind.NEW, limit=DEPENDENCY_NEW_ITEMS_MAX).items


def trigger_data(upstream_id: uuid.UUID, result: Any, new_items: list[Any]) -> dict[str, Any]:
    return {"job_id": str(upstream_id), "result": result, "new_items": new_items}
