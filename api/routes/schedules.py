"""Schedule routes. A saved schedule wakes the elected scheduler when its transaction commits
(``put_schedule`` notifies it through PostgreSQL), so nothing is sent from here and no
scheduler restarts."""

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Body, Response
from pydantic import BaseModel

from api.deps import Reader, RuntimeDep, SessionDep, SettingsDep, Writer
from api.errors import ApiError
from api.openapi import errors
from api.schemas import UtcDatetime
from service.engine.submission import resolve_request
from service.language.cron import ScheduleSpec
from service.platform.auth import Principal
from service.platform.clock import utcnow
from service.triggers.schedules import (
    ScheduleSummary,
    delete_schedule,
    get_schedule,
    list_schedules,
    put_schedule,
    summarize,
)

router = APIRouter(prefix="/v1", tags=["schedules"])

_NOT_FOUND = errors({404: "schedule_not_found"})


class SchedulePublic(BaseModel):
    id: uuid.UUID
    pipeline: str
    owner: str
    cron: str | None
    every_s: int | None
    timezone: str
    params: dict[str, Any]
    enabled: bool
    overlap: str
    catchup: str
    catchup_window_s: int
    jitter_s: int
    diff_mode: bool
    notify_url: str | None
    timeout_s: int | None
    next_fire_at: UtcDatetime | None
    last_fire_at: UtcDatetime | None
    last_job_id: uuid.UUID | None
    last_status: str | None
    run_count: int
    created_at: UtcDatetime
    updated_at: UtcDatetime

    @classmethod
    def of(cls, summary: ScheduleSummary) -> "SchedulePublic":
        row = summary.schedule
        return cls(
            id=row.id,
            pipeline=row.pipeline,
            owner=row.owner,
            cron=row.cron,
            every_s=row.every_s,
            timezone=row.timezone,
            params=row.params,
            enabled=row.enabled,
            overlap=row.overlap,
            catchup=row.catchup,
            catchup_window_s=row.catchup_window_s,
            jitter_s=row.jitter_s,
            diff_mode=row.diff_mode,
            notify_url=row.notify_url,
            timeout_s=row.timeout_s,
            next_fire_at=row.next_fire_at,
            last_fire_at=row.last_fire_at,
            last_job_id=row.last_job_id,
            last_status=summary.last_status,
            run_count=summary.run_count,
            created_at=row.created_at,
            updated_at=row.updated_at,
        )


class ScheduleEnvelope(BaseModel):
    schedule: SchedulePublic


class ScheduleList(BaseModel):
    schedules: list[SchedulePublic]


def _visible_to(principal: Principal) -> str | None:
    return None if principal.has("admin") else principal.owner


@router.put(
    "/pipelines/{name}/schedule",
    response_model=ScheduleEnvelope,
    responses=errors(
        {
            404: "pipeline_not_found",
            409: "schedule_limit_reached",
            422: "validation_error, cron_invalid, interval_invalid, timezone_unknown, "
            "schedule_too_frequent, params_invalid, profile_invalid",
        }
    ),
)
def save_schedule(
    name: str,
    principal: Writer,
    session: SessionDep,
    settings: SettingsDep,
    runtime: RuntimeDep,
    body: Annotated[ScheduleSpec | None, Body()] = None,
) -> ScheduleEnvelope:
    """An empty body takes the ``schedule:`` block of the pipeline's profile."""
    profile = resolve_request(
        session,
        name,
        owner=principal.owner,
        profiles_dir=settings.profiles_dir,
        known_actions=runtime.registry.names(),
    ).profile
    spec = body if body is not None else profile.schedule
    if spec is None:
        raise ApiError(
            "validation_error",
            f"no schedule given and pipeline {name!r} has no schedule block",
            {"pipeline": name},
        )
    row = put_schedule(
        session, owner=principal.owner, profile=profile, spec=spec, settings=settings, now=utcnow()
    )
    envelope = ScheduleEnvelope(schedule=SchedulePublic.of(summarize(session, [row])[0]))
    session.commit()
    return envelope


@router.get("/pipelines/{name}/schedule", response_model=ScheduleEnvelope, responses=_NOT_FOUND)
def read_schedule(name: str, principal: Reader, session: SessionDep) -> ScheduleEnvelope:
    row = get_schedule(session, owner=principal.owner, pipeline=name)
    return ScheduleEnvelope(schedule=SchedulePublic.of(summarize(session, [row])[0]))


@router.delete("/pipelines/{name}/schedule", status_code=204, responses=_NOT_FOUND)
def remove_schedule(name: str, principal: Writer, session: SessionDep) -> Response:
    delete_schedule(session, owner=principal.owner, pipeline=name)
    session.commit()
    return Response(status_code=204)


@router.get("/schedules", response_model=ScheduleList)
def all_schedules(principal: Reader, session: SessionDep) -> ScheduleList:
    """With next and last fire, the last run's status and how many runs it started."""
    summaries = list_schedules(session, owner=_visible_to(principal))
    return ScheduleList(schedules=[SchedulePublic.of(summary) for summary in summaries])
