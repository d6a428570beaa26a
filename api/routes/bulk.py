"""Bulk actions over the jobs a filter matches: ``POST /v1/jobs/cancel`` and
``POST /v1/jobs/rerun``, with a dry run, and ``GET /v1/jobs/bulk/{id}`` for their progress.

A request carries out its action batch by batch (``tasks.bulk``) and answers when it is done;
one cut short (a timeout, a restart of this process) is retried with the same ``id`` and goes
on after the last batch that committed."""

import uuid

from fastapi import APIRouter

from api.deps import CeleryDep, Reader, RuntimeDep, SessionDep, SettingsDep, ViaDep, Writer
from api.openapi import errors
from api.routes.jobs import job_statuses, visible_to
from api.schemas import BulkActionPublic, BulkCreate, BulkRerunCreate, BulkResult
from service.engine.bulk import BulkKind, BulkRequest, get_bulk, preview, start_bulk
from service.platform.auth import Principal
from service.platform.clock import utcnow
from tasks.bulk import BulkRun

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

BULK_ERRORS = errors(
    {
        400: "job_filter_invalid, invalid_query",
        404: "bulk_action_not_found",
        409: "bulk_action_conflict: the id was used for another action or filter",
        422: "validation_error, labels_invalid",
        429: "open_jobs_limit: a rerun would pass the owner's open-jobs cap; the action keeps "
        "its progress, and a retry with its id goes on",
    }
)


def _bulk(
    kind: BulkKind,
    body: BulkCreate,
    principal: Principal,
    session: SessionDep,
    run: BulkRun,
    via: ViaDep,
) -> BulkResult:
    from_step = body.from_step if isinstance(body, BulkRerunCreate) else None
    priority = body.priority if isinstance(body, BulkRerunCreate) else None
    statuses = job_statuses(body.filter.status)
    request = BulkRequest(kind, body.filter.match(statuses), from_step, priority)
    scope = visible_to(principal)
    if body.dry_run:
        count, first = preview(session, request, scope=scope, now=utcnow())
        return BulkResult(dry_run=True, count=count, job_ids=first)
    actor = via.actor(principal)
    bulk_id = body.id or uuid.uuid4()
    start_bulk(session, bulk_id, request, scope=scope, actor=actor, now=utcnow())
    session.commit()
    run.run(bulk_id, actor)
    session.expire_all()
    return BulkResult(
        dry_run=False, bulk=BulkActionPublic.of(get_bulk(session, bulk_id, scope=scope))
    )


@router.post("/cancel", response_model=BulkResult, responses=BULK_ERRORS)
def cancel_many(
    body: BulkCreate,
    principal: Writer,
    session: SessionDep,
    runtime: RuntimeDep,
    celery_app: CeleryDep,
    settings: SettingsDep,
    via: ViaDep,
) -> BulkResult:
    """Cancel every open job the filter matches (as ``GET /v1/jobs`` takes it), in batches;
    each job's cancel is audited with the action's id, and its compensations are sent."""
    run = BulkRun(celery_app, runtime, settings)
    return _bulk("cancel", body, principal, session, run, via)


@router.post("/rerun", response_model=BulkResult, responses=BULK_ERRORS)
def rerun_many(
    body: BulkRerunCreate,
    principal: Writer,
    session: SessionDep,
    runtime: RuntimeDep,
    celery_app: CeleryDep,
    settings: SettingsDep,
    via: ViaDep,
) -> BulkResult:
    """Rerun every finished job the filter matches, each from its failed step or
    ``from_step``, once per action whatever the retries; each rerun is a new job of its owner,
    under the owner's open-jobs cap and fair share, at the job's priority."""
    run = BulkRun(celery_app, runtime, settings)
    return _bulk("rerun", body, principal, session, run, via)


@router.get(
    "/bulk/{bulk_id}",
    response_model=BulkActionPublic,
    responses=errors({404: "bulk_action_not_found"}),
)
def read_bulk(bulk_id: uuid.UUID, principal: Reader, session: SessionDep) -> BulkActionPublic:
    return BulkActionPublic.of(get_bulk(session, bulk_id, scope=visible_to(principal)))
