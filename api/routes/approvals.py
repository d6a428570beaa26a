"""Approval gates: what waits for a decision, and the decisions. A decision commits before the
step it lets run is sent; with the broker away it is kept, and the sweeper sends the step."""

from typing import Annotated

from fastapi import APIRouter, Query

from api.deps import CeleryDep, Reader, RuntimeDep, SessionDep, Via, ViaDep, Writer
from api.errors import ApiError
from api.openapi import errors
from api.routes.jobs import parse_job_id, visible_to
from api.schemas import (
    ApprovalList,
    ApprovalPublic,
    DecisionCreate,
    DecisionEnvelope,
    JobPublic,
)
from service.engine.approvals import decide, list_approvals
from service.engine.jobs import job_view
from service.platform.audit import record_decision
from service.platform.auth import Principal
from service.platform.clock import utcnow
from service.platform.constants import APPROVAL_LIST_MAX
from service.platform.states import APPROVAL_WAITING, ApprovalStatus
from tasks.dispatch import publish_or_defer

router = APIRouter(prefix="/v1", tags=["approvals"])

_DECIDED = errors(
    {
        404: "job_not_found",
        409: "not_awaiting_approval, already_decided",
        422: "validation_error",
        503: "database_unavailable, broker_unavailable",
    }
)
APPROVAL_STATUSES = frozenset(status.value for status in ApprovalStatus)


def _decide(
    approve: bool,
    job_id: str,
    step_id: str,
    body: DecisionCreate,
    principal: Principal,
    session: SessionDep,
    runtime: RuntimeDep,
    celery_app: CeleryDep,
    via: Via,
) -> DecisionEnvelope:
    decided = decide(
        session,
        parse_job_id(job_id),
        step_id,
        approve=approve,
        by=principal.owner,
        comment=body.comment,
        payload=body.payload,
        visible_to=visible_to(principal),
        now=utcnow(),
    )
    record_decision(session, via.actor(principal), decided.job.id, step_id, approve=approve)
    session.commit()
    envelope = DecisionEnvelope(
        approval=ApprovalPublic.of(decided.approval, decided.job.pipeline),
        job=JobPublic.of(job_view(session, decided.job)),
    )
    session.commit()
    publish_or_defer(celery_app, runtime, decided.ready)
    return envelope


@router.post(
    "/jobs/{job_id}/steps/{step_id}/approve", response_model=DecisionEnvelope, responses=_DECIDED
)
def approve(
    job_id: str,
    step_id: str,
    body: DecisionCreate,
    principal: Writer,
    session: SessionDep,
    runtime: RuntimeDep,
    celery_app: CeleryDep,
    via: ViaDep,
) -> DecisionEnvelope:
    """The gated step runs; its ``with`` and its downstream read the payload."""
    return _decide(True, job_id, step_id, body, principal, session, runtime, celery_app, via)


@router.post(
    "/jobs/{job_id}/steps/{step_id}/reject", response_model=DecisionEnvelope, responses=_DECIDED
)
def reject(
    job_id: str,
    step_id: str,
    body: DecisionCreate,
    principal: Writer,
    session: SessionDep,
    runtime: RuntimeDep,
    celery_app: CeleryDep,
    via: ViaDep,
) -> DecisionEnvelope:
    """The gated step fails for good as ``rejected``; the failure policy decides the rest."""
    return _decide(False, job_id, step_id, body, principal, session, runtime, celery_app, via)


@router.get("/approvals", response_model=ApprovalList, responses=errors({400: "invalid_query"}))
def approvals(
    principal: Reader,
    session: SessionDep,
    status: Annotated[list[str] | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=APPROVAL_LIST_MAX)] = 100,
) -> ApprovalList:
    """Oldest request first; by default what still waits (``pending`` and ``escalated``)."""
    wanted = [part.strip() for value in status or [] for part in value.split(",") if part.strip()]
    unknown = sorted(set(wanted) - APPROVAL_STATUSES)
    if unknown:
        raise ApiError(
            "invalid_query",
            f"unknown approval status {unknown[0]!r}",
            {"param": "status", "unknown": unknown, "allowed": sorted(APPROVAL_STATUSES)},
        )
    rows = list_approvals(
        session,
        statuses=wanted or sorted(APPROVAL_WAITING),
        visible_to=visible_to(principal),
        limit=limit,
    )
    return ApprovalList(approvals=[ApprovalPublic.of(a, job.pipeline) for a, job in rows])
