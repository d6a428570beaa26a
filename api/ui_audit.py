"""The dashboard's audit page, ``/ui/audit``: the trail of ``GET /v1/audit`` for admin keys,
with the same filters; a key without the admin scope gets the 403 page, as on the API."""

import json
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request, Response
from fastapi.responses import HTMLResponse

from api.deps import SessionDep
from api.routes.audit import AuditEventPublic, audit_events
from api.ui import PAGE_SIZE, Viewer, page, templates
from service.platform.audit import AuditQuery
from service.platform.errors import AuditQueryInvalid

router = APIRouter(prefix="/ui", include_in_schema=False)

_LINKS = {"job": "/ui/jobs/{}", "pipeline": "/ui/pipelines/{}"}


def _since(value: str) -> datetime | None:
    """As ``flowbeat audit`` reads it: ISO 8601, UTC when it names no zone."""
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        message = f"since: not an ISO 8601 time: {value!r}"
        raise AuditQueryInvalid(message, {"param": "since"}) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def target_link(event: AuditEventPublic) -> str | None:
    link = _LINKS.get(event.target_kind)
    return link.format(event.target_id) if link is not None else None


def detail_text(detail: dict[str, Any]) -> str:
    return json.dumps(detail, sort_keys=True, separators=(", ", ": ")) if detail else ""


@router.get("/audit", response_class=HTMLResponse)
def audit_page(
    request: Request,
    viewer: Viewer,
    session: SessionDep,
    target: str = "",
    actor: str = "",
    action: str = "",
    since: str = "",
    cursor: str = "",
) -> Response:
    viewer.require("admin")
    filters = {"target": target, "actor": actor, "action": action, "since": since}
    query = AuditQuery(
        target or None, actor or None, action or None, _since(since), PAGE_SIZE, cursor or None
    )
    found = audit_events(viewer, session, query)
    return page(
        request,
        "audit.html",
        events=found.events,
        next_cursor=found.next_cursor,
        filters=filters,
        query=urlencode(filters),
    )


templates.env.globals["target_link"] = target_link
templates.env.filters["detail_text"] = detail_text
