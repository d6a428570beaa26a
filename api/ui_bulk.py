"""The dashboard's bulk actions, ``/ui/bulk``: cancel or rerun every job the list's filter
matches, after a page that shows their count and asks. The confirming form carries the
action's id, made when the page was, so a second click of it continues the same action instead
of starting another (``POST /v1/jobs/cancel`` and ``/v1/jobs/rerun``, called as their routes)."""

import uuid
from dataclasses import asdict
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Form, Request, Response
from fastapi.responses import HTMLResponse

from api.deps import CeleryDep, RuntimeDep, SessionDep, SettingsDep, UiVia
from api.routes import bulk
from api.schemas import BulkCreate, BulkRerunCreate, BulkResult, JobFilterBody
from api.ui import Actor, ListFilter, Viewer, moment, page
from service.language.labels import parse_labels
from service.platform.auth import Principal

router = APIRouter(prefix="/ui", include_in_schema=False)

Kind = Literal["cancel", "rerun"]


def _filter(shown: ListFilter) -> JobFilterBody:
    return JobFilterBody(
        pipeline=shown.pipeline or None,
        status=[shown.status] if shown.status else [],
        labels=parse_labels(shown.labels.split()),
        error_code=shown.error_code or None,
        since=moment("since", shown.since),
        until=moment("until", shown.until),
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
    shown: Annotated[ListFilter, Depends()],
) -> Response:
    body = BulkCreate(filter=_filter(shown), dry_run=True)
    preview = _act(action, body, viewer, session, runtime, celery_app, settings, via)
    filters = asdict(shown)
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
    since: Annotated[str, Form()] = "",
    until: Annotated[str, Form()] = "",
) -> Response:
    shown = ListFilter(status, pipeline, labels, error_code, since, until)
    body = BulkCreate(filter=_filter(shown), id=bulk_id)
    filters = asdict(shown)
    done = _act(action, body, actor, session, runtime, celery_app, settings, via)
    return page(request, "bulk.html", action=action, preview=None, filters=filters, done=done.bulk)
