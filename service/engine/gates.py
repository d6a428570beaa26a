"""The approval gate a claim passes through: run if approved, else park the step.

A gated step is claimed like any other; in the claim's transaction the gate either lets it run
(a person approved it) or parks it: the step becomes ``awaiting_approval`` with no lease, the
job ``awaiting_approval``, a decision is asked for and an event written. Parked, it holds no
worker slot and no message: ``service.engine.approvals.decide`` sends it again once decided, and a
Redis flush meanwhile loses nothing, since only PostgreSQL knows it waits.
"""

from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from service.catalogue.notices import record_event
from service.language.specs import ApprovalSpec
from service.platform.models import ApprovalRow, JobRow, StepRunRow
from service.platform.states import ApprovalStatus, JobStatus, StepStatus


def approved(session: Session, job: JobRow, row: StepRunRow, spec: ApprovalSpec) -> bool:
    """Whether a held gated step may run; when not yet decided, park it and ask for a decision.

    Called with the step's row locked and its lease just taken, so two deliveries cannot both
    ask; a delivery of a step already parked or rejected finds it settled elsewhere.
    """
    decision = session.scalar(
        select(ApprovalRow.status).where(
            ApprovalRow.job_id == row.job_id, ApprovalRow.step_id == row.step_id
        )
    )
    if decision == ApprovalStatus.APPROVED:
        return True
    if decision is None:
        park(session, job, row, spec)
    return False


def park(session: Session, job: JobRow, row: StepRunRow, spec: ApprovalSpec) -> None:
    now = row.started_at or job.created_at
    row.attempts -= 1
    row.started_at = None
    _ask(session, job, row, spec.on_timeout, now + timedelta(seconds=spec.timeout_s), now)


def ask_decision(
    session: Session, job: JobRow, row: StepRunRow, timeout_s: int, now: datetime
) -> None:
    """A loop that ran out of rounds asks a person: approved, it ends as if its condition
    held; rejected, or with no decision in ``timeout_s``, its last step fails for good."""
    _ask(session, job, row, "auto_reject", now + timedelta(seconds=timeout_s), now)


def _ask(
    session: Session, job: JobRow, row: StepRunRow, on_timeout: str, due: datetime, now: datetime
) -> None:
    row.status = StepStatus.AWAITING_APPROVAL
    row.lease_token = None
    row.lease_until = None
    job.status = JobStatus.AWAITING_APPROVAL
    session.execute(
        insert(ApprovalRow)
        .values(
            job_id=row.job_id,
            step_id=row.step_id,
            status=ApprovalStatus.PENDING,
            on_timeout=on_timeout,
            requested_at=now,
            due_at=due,
        )
        .on_conflict_do_nothing()
    )
    record_event(
        session, row.job_id, "awaiting_approval", {"step_id": row.step_id, "due_at": _iso(due)}
    )


def _iso(moment: datetime) -> str:
    return moment.isoformat()
