"""Alert rules of the key's owner, and what each sent: ``/v1/alerts``.

A rule is stored whole or refused whole (``alert_rule_invalid`` names the field); a rule from
``FLOWBEAT_ALERTS`` is shown and refused to changes (``alert_rule_managed``).
"""

import re
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, Field

from api.deps import Reader, SessionDep, SettingsDep, ViaDep, Writer
from api.errors import ApiError
from api.openapi import errors
from api.schemas import UtcDatetime
from service.alerts.rules import delete_rule, deliveries_of, get_rule, list_rules, put_rule
from service.language.specs import NAME_PATTERN
from service.platform.audit import Target, record
from service.platform.models import AlertDeliveryRow, AlertRuleRow
from service.platform.settings import AlertRuleBody

router = APIRouter(prefix="/v1/alerts", tags=["alerts"])

DELIVERIES_DEFAULT_LIMIT = 50
DELIVERIES_MAX_LIMIT = 500
_NOT_FOUND = errors({404: "alert_not_found"})
_FIXED = errors({404: "alert_not_found", 409: "alert_rule_managed"})


class AlertPublic(AlertRuleBody):
    id: uuid.UUID
    name: str
    owner: str
    source: str = Field(description="api, or settings for a rule of FLOWBEAT_ALERTS")
    created_at: UtcDatetime
    updated_at: UtcDatetime

    @classmethod
    def of(cls, row: AlertRuleRow) -> "AlertPublic":
        return cls(
            id=row.id,
            name=row.name,
            owner=row.owner,
            kind=row.kind,
            url=row.url,
            threshold=row.threshold,
            pipeline=row.pipeline,
            secret=row.secret,
            format=row.format,
            dedupe_s=row.dedupe_s,
            enabled=row.enabled,
            source=row.source,
            created_at=row.created_at,
            updated_at=row.updated_at,
        )


class AlertEnvelope(BaseModel):
    alert: AlertPublic


class AlertList(BaseModel):
    alerts: list[AlertPublic]


class DeliveryPublic(BaseModel):
    id: int
    delivery_id: str = Field(description="X-Flowbeat-Delivery of every attempt")
    event_key: str
    subject: str
    status: str = Field(description="pending, delivered or failed (gave up)")
    attempts: int
    suppressed: int = Field(description="later events of the subject its window held back")
    next_attempt_at: UtcDatetime | None
    last_error: str | None
    created_at: UtcDatetime
    delivered_at: UtcDatetime | None
    event: dict[str, Any]

    @classmethod
    def of(cls, row: AlertDeliveryRow) -> "DeliveryPublic":
        return cls(
            id=row.id,
            delivery_id=row.delivery_id,
            event_key=row.event_key,
            subject=row.subject,
            status=row.status,
            attempts=row.attempts,
            suppressed=row.suppressed,
            next_attempt_at=row.next_attempt_at if row.status == "pending" else None,
            last_error=row.last_error,
            created_at=row.created_at,
            delivered_at=row.delivered_at,
            event=row.payload,
        )


class DeliveryList(BaseModel):
    deliveries: list[DeliveryPublic]
    next_before: int | None = Field(description="pass as before= for the next page")


def _name(name: str) -> str:
    if not re.fullmatch(NAME_PATTERN, name):
        raise ApiError("invalid_query", f"{name!r} is not an alert name", {"param": "name"})
    return name


@router.put(
    "/{name}",
    response_model=AlertEnvelope,
    responses={
        201: {"model": AlertEnvelope},
        **errors(
            {
                400: "invalid_query: not an alert name",
                409: "alert_rule_managed",
                422: "validation_error, alert_rule_invalid",
            }
        ),
    },
)
def save_alert(
    name: str,
    body: AlertRuleBody,
    principal: Writer,
    session: SessionDep,
    settings: SettingsDep,
    response: Response,
    via: ViaDep,
) -> AlertEnvelope:
    """201 for a new rule, 200 for a replaced one (its deliveries kept)."""
    saved = put_rule(session, _name(name), body, owner=principal.owner, settings=settings)
    action = "alert.create" if saved.created else "alert.update"
    detail = body.model_dump(include={"kind", "threshold", "pipeline", "format", "enabled"})
    record(session, via.actor(principal), action, Target("alert", name), detail)
    session.commit()
    session.refresh(saved.rule)
    response.status_code = 201 if saved.created else 200
    return AlertEnvelope(alert=AlertPublic.of(saved.rule))


@router.get("", response_model=AlertList)
def alerts(principal: Reader, session: SessionDep) -> AlertList:
    return AlertList(alerts=[AlertPublic.of(row) for row in list_rules(session, principal.owner)])


@router.get("/{name}", response_model=AlertEnvelope, responses=_NOT_FOUND)
def read_alert(name: str, principal: Reader, session: SessionDep) -> AlertEnvelope:
    return AlertEnvelope(alert=AlertPublic.of(get_rule(session, name, principal.owner)))


@router.delete("/{name}", status_code=204, responses=_FIXED)
def remove_alert(name: str, principal: Writer, session: SessionDep, via: ViaDep) -> Response:
    delete_rule(session, name, principal.owner)
    record(session, via.actor(principal), "alert.delete", Target("alert", name))
    session.commit()
    return Response(status_code=204)


@router.get("/{name}/deliveries", response_model=DeliveryList, responses=_NOT_FOUND)
def deliveries(
    name: str,
    principal: Reader,
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=DELIVERIES_MAX_LIMIT)] = DELIVERIES_DEFAULT_LIMIT,
    before: Annotated[int | None, Query(ge=1, description="next_before of the last page")] = None,
) -> DeliveryList:
    """Newest first: each alert the rule queued, its attempts and outcome."""
    rule = get_rule(session, name, principal.owner)
    rows = deliveries_of(session, rule, limit=limit, before=before)
    last = rows[-1].id if len(rows) == limit else None
    return DeliveryList(deliveries=[DeliveryPublic.of(row) for row in rows], next_before=last)
