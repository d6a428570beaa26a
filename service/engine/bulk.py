"""Bulk actions: cancel, or rerun, every job a filter matches, in batches.

A bulk action has an id (the client's, or one it is given) and a row that stores its filter,
frozen when it starts (only jobs created before then, in the statuses it can change), and the
last job it went past. Each batch locks that row, acts on the next jobs in (created_at, id)
order, audits each change with the action's id and moves the row on, in one transaction: a
batch happens whole or not at all, and a retry of the action after a timeout or an API restart
continues after the last batch that committed instead of starting again. A rerun is stored
under the key ``bulk:<action>:<job>``, so a job is never rerun twice by one action even by two
retries at once. Functions flush; the caller commits, then publishes what a batch made ready.
"""

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from service.engine.filters import JobFilter, after
from service.engine.jobs import cancel_job
from service.engine.reruns import RerunRequest, rerun_job
from service.language.snapshots import job_profile
from service.platform.audit import Actor, Target, record
from service.platform.constants import BULK_PREVIEW_IDS
from service.platform.db import custom_plans
from service.platform.errors import (
    BulkActionConflict,
    BulkActionNotFound,
    FlowbeatError,
    JobFilterInvalid,
    OpenJobsLimit,
)
from service.platform.models import BulkActionRow, JobRow, StepRunRow
from service.platform.states import JOB_FINAL, JOB_OPEN, STEP_SUCCESSFUL

BulkKind = Literal["cancel", "rerun"]
ACTS_ON: dict[str, frozenset[str]] = {"cancel": JOB_OPEN, "rerun": JOB_FINAL}
RUNNING, DONE = "running", "done"


@dataclass(frozen=True)
class BulkRequest:
    kind: BulkKind
    match: JobFilter
    from_step: str | None = None
    """A rerun's step; ``None`` reruns each job from its first step that did not succeed."""
    priority: int | None = None

    def options(self) -> dict[str, Any]:
        """What makes a retry the same action: what it asked, before ``narrowed`` froze it."""
        return {
            "asked": self.match.to_json(),
            "from_step": self.from_step,
            "priority": self.priority,
        }


@dataclass(frozen=True)
class Admission:
    """What a rerun is let in under, as a submission of its owner is."""

    open_jobs_limit: int = 0
    fair_share_ahead: int = 0


@dataclass
class Batch:
    """What a batch changed, for the caller to send after its commit."""

    revoke: list[str] = field(default_factory=list)
    compensate: list[uuid.UUID] = field(default_factory=list)
    reruns: list[uuid.UUID] = field(default_factory=list)
    """New jobs let in now: their steps are to be sent."""
    done: bool = False
    blocked: OpenJobsLimit | None = None


def frozen_filter(request: BulkRequest, now: datetime) -> JobFilter:
    if request.match.is_empty():
        raise JobFilterInvalid(
            "a bulk action needs a filter; to act on every job it may change, give its statuses",
            {"param": "filter"},
        )
    return request.match.narrowed(ACTS_ON[request.kind], now)


def preview(
    session: Session, request: BulkRequest, *, scope: str | None, now: datetime
) -> tuple[int, list[uuid.UUID]]:
    """A dry run: how many jobs the action would change now, and the first of them."""
    where = frozen_filter(request, now).clauses(scope)
    custom_plans(session)
    count = session.scalar(select(func.count()).select_from(JobRow).where(*where)) or 0
    first = session.scalars(
        select(JobRow.id)
        .where(*where)
        .order_by(JobRow.created_at, JobRow.id)
        .limit(BULK_PREVIEW_IDS)
    )
    return count, list(first)


def start_bulk(
    session: Session,
    bulk_id: uuid.UUID,
    request: BulkRequest,
    *,
    scope: str | None,
    actor: Actor,
    now: datetime,
) -> BulkActionRow:
    """The action's row, stored now, or the one stored by an earlier try of the same id; an
    id used for another action is refused, one of another owner's is unknown."""
    existing = session.get(BulkActionRow, bulk_id)
    if existing is None:
        match = frozen_filter(request, now)
        matched = session.scalar(
            select(func.count()).select_from(JobRow).where(*match.clauses(scope))
        )
        values = {
            "id": bulk_id, "kind": request.kind, "scope": scope, "actor": actor.actor,
            "filter": match.to_json(), "options": request.options(), "status": RUNNING,
            "matched": matched or 0, "acted": 0, "skipped": 0, "created_at": now,
            "updated_at": now,
        }  # fmt: skip
        stored = session.execute(
            insert(BulkActionRow)
            .values(values)
            .on_conflict_do_nothing()
            .returning(BulkActionRow.id)
        ).first()
        if stored is not None:
            detail = {"filter": values["filter"], "matched": values["matched"]}
            target = Target("bulk", str(bulk_id))
            record(session, actor, f"bulk.{request.kind}", target, detail, at=now)
        existing = session.get(BulkActionRow, bulk_id, populate_existing=True)
        assert existing is not None
    return same_action(existing, request, scope)


def same_action(row: BulkActionRow, request: BulkRequest, scope: str | None) -> BulkActionRow:
    if scope is not None and row.scope != scope:
        raise BulkActionNotFound(f"no bulk action {row.id}", {"bulk_id": str(row.id)})
    if row.kind != request.kind or row.options != request.options():
        raise BulkActionConflict(
            f"bulk action {row.id} was started with another action, filter or options",
            {"bulk_id": str(row.id), "kind": row.kind, "filter": row.options.get("asked")},
        )
    return row


def get_bulk(session: Session, bulk_id: uuid.UUID, *, scope: str | None) -> BulkActionRow:
    row = session.get(BulkActionRow, bulk_id)
    if row is None or (scope is not None and row.scope != scope):
        raise BulkActionNotFound(f"no bulk action {bulk_id}", {"bulk_id": str(bulk_id)})
    return row


def next_batch(
    session: Session,
    bulk_id: uuid.UUID,
    actor: Actor,
    *,
    size: int,
    now: datetime,
    admission: Admission = Admission(),
) -> Batch:
    """Act on the action's next ``size`` jobs under its row's lock, so that two tries of it
    take turns rather than the same jobs. A job that changed meanwhile (finished before its
    cancel, say) is skipped; an owner at its open-jobs cap stops the batch before that rerun,
    and the next try goes on from there."""
    bulk = session.get(BulkActionRow, bulk_id, with_for_update=True, populate_existing=True)
    assert bulk is not None
    custom_plans(session)
    batch = Batch()
    if bulk.status == DONE:
        batch.done = True
        return batch
    query = (
        select(JobRow.id, JobRow.created_at)
        .where(*JobFilter.from_json(bulk.filter).clauses(bulk.scope))
        .order_by(JobRow.created_at, JobRow.id)
        .limit(size)
    )
    if bulk.after_created_at is not None and bulk.after_id is not None:
        query = query.where(after(bulk.after_created_at, bulk.after_id))
    rows = session.execute(query).all()
    for job_id, created_at in rows:
        try:
            changed = _act(session, bulk, job_id, actor, batch, now, admission)
        except OpenJobsLimit as limit:
            batch.blocked = limit
            break
        except FlowbeatError:
            changed = False
        bulk.acted += changed
        bulk.skipped += not changed
        bulk.after_created_at, bulk.after_id = created_at, job_id
    bulk.updated_at = now
    if batch.blocked is None and len(rows) < size:
        bulk.status, bulk.finished_at = DONE, now
        batch.done = True
    session.flush()
    return batch


def _act(
    session: Session,
    bulk: BulkActionRow,
    job_id: uuid.UUID,
    actor: Actor,
    batch: Batch,
    now: datetime,
    admission: Admission,
) -> bool:
    detail = {"bulk_id": str(bulk.id)}
    if bulk.kind == "cancel":
        job, running = cancel_job(session, job_id, owner=bulk.scope, now=now)
        if job.finished_at != now:
            return False
        record(session, actor, "job.cancel", Target("job", str(job_id)), detail, at=now)
        batch.revoke.extend(running)
        profile = job_profile(job)
        if profile.on_cancel == "compensate" and any(s.compensate for s in profile.steps):
            batch.compensate.append(job_id)
        return True
    from_step = bulk.options["from_step"] or first_unsuccessful_step(session, job_id)
    request = RerunRequest(
        from_step=from_step,
        priority=bulk.options["priority"],
        idempotency_key=f"bulk:{bulk.id}:{job_id}",
    )
    rerun = rerun_job(
        session,
        job_id,
        request,
        visible_to=bulk.scope,
        now=now,
        open_jobs_limit=admission.open_jobs_limit,
        fair_share_ahead=admission.fair_share_ahead,
    )
    detail.update(job_id=str(rerun.id), from_step=from_step or "")
    record(session, actor, "job.rerun", Target("job", str(job_id)), detail, at=now)
    if rerun.waiting_for is None:
        batch.reruns.append(rerun.id)
    return True


def first_unsuccessful_step(session: Session, job_id: uuid.UUID) -> str | None:
    """The job's failed step, where a rerun picks up: its first step, in the order the steps
    were stored, that did not succeed; ``None`` (every step) when all did."""
    rows = session.execute(
        select(StepRunRow.step_id, StepRunRow.status)
        .where(StepRunRow.job_id == job_id, StepRunRow.shard < 0)
        .order_by(StepRunRow.id)
    )
    return next((step for step, status in rows if status not in STEP_SUCCESSFUL), None)
