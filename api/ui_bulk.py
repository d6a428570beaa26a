"""The dashboard's bulk actions, ``/ui/bulk``: cancel or rerun every job the list's filter
matches, after a page that shows their count and asks. The confirming form carries the
action's id, made when the page was, so a second click of it continues the same action instead
of starting another (``POST /v1/jobs/cancel`` and ``/v1/jobs/rerun``, called as their routes)."""

import uuid
from typing import Annotated, Literal

from fastapi import APIRouter, Form, Request, Response
from fastapi.responses import HTMLResponse

from api.deps import CeleryDep, RuntimeDep, SessionDep, SettingsDep, UiVia
from api.routes import bulk
from api.schemas import BulkCreate, BulkRerunCreate, BulkResult, JobFilterBody
from api.ui import Actor, Viewer, page
from service.language.labels import parse_labels
from service.platform.auth import Principal

router = APIRouter(prefix="/ui", include_in_schema=False)

Kind = Literal["cancel", "rerun"]


def _filter(status: str, pipeline: str, labels: str, error_code: str) -> JobFilterBody:
    return JobFilterBody(
        pipeline=pipeline or None,
        status=[status] if status else [],
        labels=parse_labels(labels.split()),
        error_code=error_code or None,
    )


def _act(
    action: Kind,
    body: BulkCreate,
    principal: Principal,
    session: SessionDep,
    runtime: RuntimeDep,
    celery_app: CeleryDep,
    settings: SettingsDep,
    via: UiVia,
) -> BulkResult:
    if action == "cancel":
        return bulk.cancel_many(body, principal, session, runtime, celery_app, settings, via)
    rerun = BulkRerunCreate.model_validate(body.model_dump())
    return bulk.rerun_many(rerun, principal, session, runtime, celery_app, settings, via)


@router.get("/bulk", response_class=HTMLResponse)
def confirm(
    request: Request,
    viewer: Viewer,
    session: SessionDep,
    runtime: RuntimeDep,
    celery_app: CeleryDep,
    settings: SettingsDep,
    via: UiVia,
    action: Kind,
    status: str = "",
    pipeline: str = "",
    labels: str = "",
    error_code: str = "",
) -> Response:
    match = _filter(status, pipeline, labels, error_code)
    body = BulkCreate(filter=match, dry_run=True)
    preview = _act(action, body, viewer, session, runtime, celery_app, settings, via)
    filters = {"status": status, "pipeline": pipeline, "labels": labels, "error_code": error_code}
    return page(
        request,
        "bulk.html",
        action=action,
        preview=preview,
        filters=filters,
        bulk_id=uuid.uuid4(),
        done=None,
    )


@router.post("/bulk", response_class=HTMLResponse)
def act(
    request: Request,
    actor: Actor,
    session: SessionDep,
    runtime: RuntimeDep,
    celery_app: CeleryDep,
    settings: SettingsDep,
    via: UiVia,
    action: Annotated[Kind, Form()],
    bulk_id: Annotated[uuid.UUID, Form()],
    status: Annotated[str, Form()] = "",
    pipeline: Annotated[str, Form()] = "",
    labels: Annotated[str, Form()] = "",
    error_code: Annotated[str, Form()] = "",
) -> Response:
    body = BulkCreate(filter=_filter(status, pipeline, labels, error_code), id=bulk_id)
    done = _act(action, body, actor, session, runtime, celery_app, settings, via)
    filters = {"status": status, "pipeline": pipeline, "labels": labels, "error_code": error_code}
    return page(request, "bulk.html", action=action, preview=None, filters=filters, done=done.bulk)
