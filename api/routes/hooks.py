"""Webhook routes: admins bind hooks to pipelines; a signed delivery starts a job.

``POST /v1/hooks/{name}`` takes no API key: the delivery's HMAC signature is its credential.
Its job is committed with the delivery id before the job's messages are sent.
"""

import re
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Request, Response
from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.concurrency import run_in_threadpool

from api.deps import CeleryDep, RuntimeDep, SessionDep, SettingsDep, ViaDep, require
from api.errors import ApiError
from api.openapi import RETRY_AFTER, errors, read_by_route
from api.schemas import ErrorEnvelope, JobPublic, JobSubmitted, UtcDatetime
from api.throttle import check_hook_rate
from service.engine.jobs import job_view, new_job_view
from service.language.labels import label_templates
from service.language.snapshots import job_profile
from service.language.specs import NAME_PATTERN
from service.platform.audit import Target, record
from service.platform.auth import Principal
from service.platform.clock import utcnow
from service.platform.errors import FlowbeatError, HookNotFound
from service.platform.metrics import WEBHOOK_DELIVERIES
from service.platform.models import HookRow
from service.triggers.hooks import (
    HookSpec,
    accept_delivery,
    delete_hook,
    get_hook,
    list_hooks,
    put_hook,
)
from tasks.dispatch import send_new_job

router = APIRouter(prefix="/v1/hooks", tags=["hooks"])
Admin = Annotated[Principal, Depends(require("admin"))]

_NOT_FOUND = errors({404: "hook_not_found"})


class HookPut(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pipeline: str = Field(min_length=1, max_length=200, description="a pipeline name")
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="param -> value, where strings may read the delivery: ${{ payload.a.b }}",
    )
    secret: str | None = Field(
        default=None,
        min_length=24,
        max_length=128,
        description="the signing secret; generated for a new hook when left out",
    )
    enabled: bool = True
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="labels of the jobs it starts, over the profile's; a value may read the "
        'job\'s params: {"tenant": "${{ params.tenant }}"}',
    )

    _labels_within_limits = field_validator("labels", mode="before")(label_templates)


class HookPublic(BaseModel):
    id: uuid.UUID
    name: str
    owner: str
    pipeline: str
    params: dict[str, Any]
    labels: dict[str, str]
    enabled: bool
    created_at: UtcDatetime
    updated_at: UtcDatetime

    @classmethod
    def of(cls, row: HookRow) -> "HookPublic":
        return cls(
            id=row.id,
            name=row.name,
            owner=row.owner,
            pipeline=row.pipeline,
            params=row.params,
            labels=row.labels,
            enabled=row.enabled,
            created_at=row.created_at,
            updated_at=row.updated_at,
        )


class HookEnvelope(BaseModel):
    hook: HookPublic
    secret: str | None = Field(
        default=None,
        description="set only by the request that set it: keep it, it is not shown again",
    )


class HookList(BaseModel):
    hooks: list[HookPublic]


def _name(name: str) -> str:
    if not re.fullmatch(NAME_PATTERN, name):
        raise ApiError("invalid_query", f"{name!r} is not a hook name", {"param": "name"})
    return name


@router.put(
    "/{name}",
    response_model=HookEnvelope,
    responses={
        201: {"model": HookEnvelope},
        **errors(
            {
                400: "invalid_query: not a hook name",
                404: "pipeline_not_found",
                422: "validation_error, hook_invalid, params_invalid, profile_invalid",
            }
        ),
    },
)
def save_hook(
    name: str,
    body: HookPut,
    principal: Admin,
    session: SessionDep,
    runtime: RuntimeDep,
    settings: SettingsDep,
    response: Response,
    via: ViaDep,
) -> HookEnvelope:
    """201 with the secret for a new hook; 200 for a replaced one (the secret only if given)."""
    saved = put_hook(
        session,
        _name(name),
        HookSpec(body.pipeline, body.params, body.secret, body.enabled, body.labels),
        owner=principal.owner,
        profiles_dir=settings.profiles_dir,
        known_actions=runtime.registry.names(),
    )
    action = "hook.create" if saved.created else "hook.update"
    detail = {"pipeline": body.pipeline, "enabled": body.enabled, "secret_set": bool(saved.secret)}
    record(session, via.actor(principal), action, Target("hook", name), detail)
    session.commit()
    session.refresh(saved.hook)
    response.status_code = 201 if saved.created else 200
    return HookEnvelope(hook=HookPublic.of(saved.hook), secret=saved.secret)


@router.get("", response_model=HookList)
def hooks(_: Admin, session: SessionDep) -> HookList:
    return HookList(hooks=[HookPublic.of(row) for row in list_hooks(session)])


@router.get("/{name}", response_model=HookEnvelope, responses=_NOT_FOUND)
def read_hook(name: str, _: Admin, session: SessionDep) -> HookEnvelope:
    return HookEnvelope(hook=HookPublic.of(get_hook(session, name)))


@router.delete("/{name}", status_code=204, responses=_NOT_FOUND)
def remove_hook(name: str, principal: Admin, session: SessionDep, via: ViaDep) -> Response:
    delete_hook(session, name)
    record(session, via.actor(principal), "hook.delete", Target("hook", name))
    session.commit()
    return Response(status_code=204)


@router.post(
    "/{name}",
    status_code=202,
    response_model=JobSubmitted,
    responses={
        200: {
            "model": JobSubmitted,
            "description": "the job this delivery id started before, or (deduplicated: true) "
            "the open or recent job its pipeline's dedupe key matched",
        },
        **errors(
            {
                401: "hook_signature_invalid, hook_timestamp_stale",
                404: "hook_not_found, pipeline_not_found",
                409: "hook_delivery_seen, duplicate_job",
                422: "hook_payload_invalid, params_invalid",
                503: "database_unavailable, broker_unavailable",
            }
        ),
        429: {
            "model": ErrorEnvelope,
            "description": "rate_limited, open_jobs_limit",
            "headers": {"Retry-After": RETRY_AFTER},
        },
    },
    openapi_extra={
        "security": [],
        **read_by_route(
            {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}}
        ),
    },
)
async def deliver(
    name: str,
    request: Request,
    session: SessionDep,
    runtime: RuntimeDep,
    settings: SettingsDep,
    celery_app: CeleryDep,
    x_flowbeat_timestamp: Annotated[str | None, Header()] = None,
    x_flowbeat_signature: Annotated[str | None, Header()] = None,
    x_flowbeat_delivery: Annotated[str | None, Header()] = None,
) -> Response:
    """A signed delivery: 202 with the job it started, or 200 with the job its delivery id
    started before. Signature: ``sha256=`` hex HMAC-SHA256 of
    ``<X-Flowbeat-Delivery>.<X-Flowbeat-Timestamp>.<raw body>`` with the hook's secret.
    Deliveries to one hook share the per-key rate limit's rate and burst."""
    headers = {
        "timestamp": x_flowbeat_timestamp,
        "signature": x_flowbeat_signature,
        "delivery": x_flowbeat_delivery,
    }

    def accept(body: bytes) -> tuple[JobSubmitted, int]:
        accepted = accept_delivery(
            session,
            name,
            headers,
            body,
            now=utcnow(),
            profiles_dir=settings.profiles_dir,
            known_actions=runtime.registry.names(),
            max_open_jobs=settings.max_open_jobs_per_owner,
        )
        session.commit()
        job = accepted.job
        if not accepted.created:
            view = JobPublic.of(job_view(session, job))
            return JobSubmitted(job=view, deduplicated=accepted.deduplicated), 200
        send_new_job(celery_app, runtime, job)
        return JobSubmitted(job=JobPublic.of(new_job_view(job, job_profile(job)))), 202

    try:
        if not re.fullmatch(NAME_PATTERN, name):
            raise HookNotFound(f"no hook {name!r}", {"hook": name})
        await check_hook_rate(request.app, name)
        answer, status_code = await run_in_threadpool(accept, await request.body())
    except FlowbeatError as exc:
        WEBHOOK_DELIVERIES.labels(exc.code).inc()
        raise
    WEBHOOK_DELIVERIES.labels("accepted" if status_code == 202 else "replayed").inc()
    return Response(
        answer.model_dump_json(),
        status_code=status_code,
        media_type="application/json",
    )
