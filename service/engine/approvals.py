"""Decisions on gated steps: by a person through the API, or by the elected beat replica when
one times out. Functions flush; the caller commits, then sends the plan a decision made ready.

Approved, the step goes back to ``pending`` and is sent again; its gate then lets it run.
Rejected, it is failed for good as ``rejected``, and the job's failure policy takes it from
there. A decision is recorded once: the approval row is locked, and a second decision is
``already_decided``.
"""

import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session, sessionmaker

from service.catalogue.notices import Notice, record_event, try_delivery
from service.engine.completion import record_failure, succeed_step
from service.engine.jobs import get_job
from service.engine.leases import lock_step
from service.engine.steps import StepKey
from service.language.plan import JobPlan, steps_plan
from service.language.snapshots import job_profile, step_facts
from service.platform.db import unit_of_work
from service.platform.errors import AlreadyDecided, NotAwaitingApproval
from service.platform.models import ApprovalRow, JobRow, StepRunRow
from service.platform.settings import Settings
from service.platform.states import (
    APPROVAL_WAITING,
    JOB_FINAL,
    ApprovalStatus,
    JobStatus,
    StepStatus,
)

TIMEOUT_DECIDER = "system:timeout"
EXPIRE_BATCH = 100


@dataclass(frozen=True)
class Decided:
    job: JobRow
    approval: ApprovalRow
    ready: JobPlan


def decide(
    session: Session,
    job_id: uuid.UUID,
    step_id: str,
    *,
    approve: bool,
    by: str,
    comment: str | None = None,
    payload: Any = None,
    visible_to: str | None,
    now: datetime,
) -> Decided:
    job = get_job(session, job_id, owner=visible_to)
    approval = _locked_approval(session, job_id, step_id)
    if approval.status not in APPROVAL_WAITING:
        raise AlreadyDecided(
            f"step {step_id!r} was already {approval.status} by {approval.decided_by}",
            {"status": approval.status, "decided_by": approval.decided_by},
        )
    row = lock_step(session, StepKey(job_id, step_id))
    if row.status != StepStatus.AWAITING_APPROVAL or job.status in JOB_FINAL:
        raise NotAwaitingApproval(
            f"step {step_id!r} of job {job_id} is not awaiting approval",
            {"job_status": job.status, "step_status": row.status},
        )
    approval.status = ApprovalStatus.APPROVED if approve else ApprovalStatus.REJECTED
    approval.decided_by, approval.decided_at = by, now
    approval.comment, approval.payload = comment, payload
    record_event(
        session,
        job_id,
        "approval_decided",
        {"step_id": step_id, "status": approval.status, "by": by, "comment": comment},
    )
    ready = _go_on(session, job, row, approval, now).at(job.priority)
    if job.status == JobStatus.AWAITING_APPROVAL and not _parked_steps(session, job_id):
        job.status = JobStatus.RUNNING
    session.flush()
    return Decided(job, approval, ready)


def _locked_approval(session: Session, job_id: uuid.UUID, step_id: str) -> ApprovalRow:
    approval = session.scalars(
        select(ApprovalRow)
        .where(ApprovalRow.job_id == job_id, ApprovalRow.step_id == step_id)
        .with_for_update()
    ).one_or_none()
    if approval is None:
        raise NotAwaitingApproval(
            f"step {step_id!r} of job {job_id} is not awaiting approval", {"step_id": step_id}
        )
    return approval


def _go_on(
    session: Session, job: JobRow, row: StepRunRow, approval: ApprovalRow, now: datetime
) -> JobPlan:
    profile = job_profile(job)
    if approval.status == ApprovalStatus.APPROVED and step_facts(profile, row.step_id).ends_round:
        return succeed_step(session, row, profile, now)
    if approval.status == ApprovalStatus.APPROVED:
        row.status = StepStatus.PENDING
        return steps_plan(profile, job.id, [row.step_id])
    error = {
        "code": "rejected",
        "message": f"rejected by {approval.decided_by}"
        + (f": {approval.comment}" if approval.comment else ""),
        "details": {"decided_by": approval.decided_by},
    }
    key = StepKey(job.id, row.step_id)
    return record_failure(session, row, key, error, None, now, StepStatus.REJECTED).ready


def _parked_steps(session: Session, job_id: uuid.UUID) -> int:
    return int(
        session.scalar(
            select(func.count())
            .select_from(StepRunRow)
            .where(
                StepRunRow.job_id == job_id,
                StepRunRow.status == StepStatus.AWAITING_APPROVAL,
            )
        )
        or 0
    )


def _shown(statuses: list[str], visible_to: str | None) -> list[ColumnElement[bool]]:
    """Approvals in ``statuses`` the key may read; waiting ones of open jobs only."""
    where: list[ColumnElement[bool]] = [ApprovalRow.status.in_(statuses)]
    if visible_to is not None:
        where.append(JobRow.owner == visible_to)
    if set(statuses) <= APPROVAL_WAITING:
        where.append(JobRow.status.not_in(list(JOB_FINAL)))
    return where


def list_approvals(
    session: Session, *, statuses: list[str], visible_to: str | None, limit: int
) -> list[tuple[ApprovalRow, JobRow]]:
    """What waits for a decision (or was decided), oldest request first."""
    query = (
        select(ApprovalRow, JobRow)
        .join(JobRow, JobRow.id == ApprovalRow.job_id)
        .where(*_shown(statuses, visible_to))
        .order_by(ApprovalRow.requested_at, ApprovalRow.job_id, ApprovalRow.step_id)
        .limit(limit)
    )
    return [(approval, job) for approval, job in session.execute(query)]


def count_waiting(session: Session, *, visible_to: str | None) -> int:
    """All that ``list_approvals`` would list as waiting, however many that is."""
    query = (
        select(func.count())
        .select_from(ApprovalRow)
        .join(JobRow, JobRow.id == ApprovalRow.job_id)
        .where(*_shown(sorted(APPROVAL_WAITING), visible_to))
    )
    return int(session.scalar(query) or 0)


@dataclass
class Expired:
    ready: list[JobPlan]
    escalated: list[tuple[uuid.UUID, str]]


def expire_due(session: Session, now: datetime) -> Expired:
    """Carry out the timeout action of every decision past due: approve, reject, or escalate
    (and reject once ``escalate_after_s`` has passed too)."""
    expired = Expired([], [])
    due = session.scalars(
        select(ApprovalRow)
        .where(ApprovalRow.status.in_(list(APPROVAL_WAITING)), ApprovalRow.due_at <= now)
        .order_by(ApprovalRow.due_at)
        .limit(EXPIRE_BATCH)
        .with_for_update(skip_locked=True)
    ).all()
    for approval in due:
        if approval.status == ApprovalStatus.PENDING and approval.on_timeout == "escalate":
            _escalate(session, approval, now)
            expired.escalated.append((approval.job_id, approval.step_id))
            continue
        approve = approval.status == ApprovalStatus.PENDING and approval.on_timeout == (
            "auto_approve"
        )
        try:
            decided = decide(
                session,
                approval.job_id,
                approval.step_id,
                approve=approve,
                by=TIMEOUT_DECIDER,
                comment=f"no decision by {approval.due_at.isoformat()}",
                visible_to=None,
                now=now,
            )
        except NotAwaitingApproval:
            approval.status = ApprovalStatus.REJECTED
            approval.decided_by, approval.decided_at = TIMEOUT_DECIDER, now
            continue
        expired.ready.append(decided.ready)
    return expired


def _escalate(session: Session, approval: ApprovalRow, now: datetime) -> None:
    job = session.get(JobRow, approval.job_id)
    assert job is not None
    spec = job_profile(job).step(approval.step_id).approval
    assert spec is not None
    approval.status = ApprovalStatus.ESCALATED
    approval.escalated_at = now
    approval.due_at = now + timedelta(seconds=spec.escalate_after_s)
    record_event(
        session,
        approval.job_id,
        "approval_escalated",
        {"step_id": approval.step_id, "due_at": approval.due_at.isoformat()},
    )


def escalation_notice(session: Session, job_id: uuid.UUID, step_id: str) -> Notice | None:
    job = session.get(JobRow, job_id)
    approval = session.get(ApprovalRow, (job_id, step_id))
    if job is None or approval is None:
        return None
    spec = job_profile(job).step(step_id).approval
    if spec is None or spec.escalate_to is None:
        return None
    payload = {
        "event": "approval_escalated",
        "job_id": str(job_id),
        "pipeline": job.pipeline,
        "step_id": step_id,
        "requested_at": approval.requested_at.isoformat(),
        "reject_at": approval.due_at.isoformat(),
    }
    body = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return Notice(url=spec.escalate_to, body=body, delivery_id=f"escalation-{job_id}-{step_id}")


def send_escalation(
    sessions: sessionmaker[Session],
    settings: Settings,
    job_id: uuid.UUID,
    step_id: str,
    *,
    attempt: int,
    now_s: float,
) -> float | None:
    """One delivery of an escalation, signed as diff notices are; the delay before the next
    attempt, or ``None`` once delivered or given up (recorded as an event either way)."""
    with unit_of_work(sessions) as session:
        notice = escalation_notice(session, job_id, step_id)
    if notice is None:
        return None
    return try_delivery(
        sessions,
        settings,
        job_id,
        notice,
        sender="escalation",
        kinds=("escalation_notified", "escalation_notify_failed"),
        attempt=attempt,
        now_s=now_s,
        step_id=step_id,
    )
