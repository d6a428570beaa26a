"""The audit trail, for admins: who changed what, through which channel, newest first."""

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field

from api.deps import Admin, SessionDep
from api.openapi import errors
from api.schemas import UtcDatetime
from service.platform.audit import AuditQuery, list_events
from service.platform.constants import AUDIT_LIST_DEFAULT_LIMIT, AUDIT_LIST_MAX_LIMIT
from service.platform.models import AuditEventRow

router = APIRouter(prefix="/v1/audit", tags=["audit"])


class AuditEventPublic(BaseModel):
    id: int
    at: UtcDatetime
    channel: str = Field(description="api, cli, mcp or ui")
    source: str = Field(description="the route or the command the change came through")
    actor: str = Field(description="the key's prefix (api, mcp, ui) or the OS user (cli)")
    owner: str = Field(description="the owner the actor acted as")
    action: str = Field(description="job.submit, pipeline.save, schedule.pause, key.revoke, ...")
    target_kind: str
    target_id: str
    detail: dict[str, Any]

    @classmethod
    def of(cls, row: AuditEventRow) -> "AuditEventPublic":
        return cls.model_validate(row, from_attributes=True)


class AuditList(BaseModel):
    events: list[AuditEventPublic]
    next_cursor: str | None


def audit_query(
    target: Annotated[
        str | None, Query(max_length=300, description="kind:id, kind: or an id or name")
    ] = None,
    actor: Annotated[
        str | None, Query(max_length=128, description="a key prefix, an OS user or an owner")
    ] = None,
    action: Annotated[
        str | None, Query(max_length=32, description="job.cancel, or job for every job action")
    ] = None,
    since: Annotated[datetime | None, Query(description="ISO 8601 with a zone")] = None,
    limit: Annotated[int, Query(ge=1, le=AUDIT_LIST_MAX_LIMIT)] = AUDIT_LIST_DEFAULT_LIMIT,
    cursor: Annotated[str | None, Query(max_length=512)] = None,
) -> AuditQuery:
    """The filters the route and the dashboard page share."""
    return AuditQuery(target or None, actor or None, action or None, since, limit, cursor or None)


Filters = Annotated[AuditQuery, Depends(audit_query)]


@router.get(
    "",
    response_model=AuditList,
    responses=errors({400: "invalid_query, invalid_cursor", 403: "forbidden: not an admin key"}),
)
def audit_events(_: Admin, session: SessionDep, query: Filters) -> AuditList:
    """Newest first; ``next_cursor`` pages on. ``target``: ``kind:id`` (``job:<id>``,
    ``pipeline:<name>``, ``schedule:<id>``, ``hook:<name>``, ``key:<prefix>``), ``kind:`` or an
    id or name alone; ``actor``: a key prefix, an OS user or an owner; ``action``:
    ``job.cancel``, or ``job`` for every action on jobs; ``since``: ISO 8601 with a zone."""
    events, next_cursor = list_events(session, query)
    return AuditList(events=[AuditEventPublic.of(e) for e in events], next_cursor=next_cursor)
