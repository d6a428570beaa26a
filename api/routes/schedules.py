"""Schedule routes. A saved schedule wakes the elected scheduler when its transaction commits
(the service notifies it through PostgreSQL), so nothing is sent from here and no scheduler
restarts.

A pipeline may have several schedules, managed under ``/schedules/{schedule}`` by id or name.
The older ``/schedule`` routes stay for a pipeline with at most one and answer ``409
schedule_ambiguous`` when it has several, rather than act on one of them at random."""

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Body, Response
from pydantic import BaseModel

from api.deps import Reader, RuntimeDep, SessionDep, SettingsDep, ViaDep, Writer
from api.errors import ApiError
from api.openapi import errors
from api.schemas import UtcDatetime
from service.engine.submission import resolve_request
from service.language.cron import ScheduleSpec
from service.language.profiles import Profile
from service.platform.audit import record, schedule_event, schedule_saved
from service.platform.auth import Principal
from service.platform.clock import utcnow
from service.platform.models import ScheduleRow
from service.triggers.schedules import (
    ScheduleSummary,
    create_schedule,
    delete_schedule,
    get_schedule,
    list_schedules,
    put_schedule,
    set_schedule,
    summarize,
)

router = APIRouter(prefix="/v1", tags=["schedules"])

_NOT_FOUND = errors({404: "schedule_not_found"})
_ONE_SCHEDULE = errors({404: "schedule_not_found", 409: "schedule_ambiguous"})
_REFUSED_SPEC = (
    "validation_error, cron_invalid, interval_invalid, timezone_unknown, "
    "schedule_too_frequent, params_invalid, profile_invalid"
)


class SchedulePublic(BaseModel):
    id: uuid.UUID
    name: str | None
    pipeline: str
    owner: str
    priority: int | None
    labels: dict[str, str]
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
            name=row.name,
            pipeline=row.pipeline,
            owner=row.owner,
            priority=row.priority,
            labels=row.labels,
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


def _profile_and_spec(
    name: str,
    body: ScheduleSpec | None,
    principal: Principal,
    session: SessionDep,
    settings: SettingsDep,
    runtime: RuntimeDep,
) -> tuple[Profile, ScheduleSpec]:
    """The pipeline and what to save; an empty body takes the ``schedule:`` block of its
    profile."""
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
    return profile, spec


def _envelope(session: SessionDep, row: ScheduleRow) -> ScheduleEnvelope:
    return ScheduleEnvelope(schedule=SchedulePublic.of(summarize(session, [row])[0]))


@router.put(
    "/pipelines/{name}/schedule",
    response_model=ScheduleEnvelope,
    responses=errors(
        {
            404: "pipeline_not_found",
            409: "schedule_limit_reached, schedule_ambiguous",
            422: _REFUSED_SPEC,
        }
    ),
)
def save_schedule(
    name: str,
    principal: Writer,
    session: SessionDep,
    settings: SettingsDep,
    runtime: RuntimeDep,
    via: ViaDep,
    body: Annotated[ScheduleSpec | None, Body()] = None,
) -> ScheduleEnvelope:
    """The pipeline's only schedule, created or replaced; an empty body takes the
    ``schedule:`` block of its profile."""
    profile, spec = _profile_and_spec(name, body, principal, session, settings, runtime)
    now = utcnow()
    row = put_schedule(
        session, owner=principal.owner, profile=profile, spec=spec, settings=settings, now=now
    )
    record(session, via.actor(principal), schedule_saved(row, now), *schedule_event(row), at=now)
    envelope = _envelope(session, row)
    session.commit()
    return envelope


@router.get("/pipelines/{name}/schedule", response_model=ScheduleEnvelope, responses=_ONE_SCHEDULE)
def read_schedule(name: str, principal: Reader, session: SessionDep) -> ScheduleEnvelope:
    """The pipeline's only schedule."""
    return _envelope(session, get_schedule(session, owner=principal.owner, pipeline=name))


@router.delete("/pipelines/{name}/schedule", status_code=204, responses=_ONE_SCHEDULE)
def remove_schedule(name: str, principal: Writer, session: SessionDep, via: ViaDep) -> Response:
    """The pipeline's only schedule."""
    row = delete_schedule(session, owner=principal.owner, pipeline=name)
    record(session, via.actor(principal), "schedule.delete", *schedule_event(row))
    session.commit()
    return Response(status_code=204)


@router.post(
    "/pipelines/{name}/schedules",
    status_code=201,
    response_model=ScheduleEnvelope,
    responses=errors(
        {
            404: "pipeline_not_found",
            409: "schedule_limit_reached, schedule_name_taken",
            422: _REFUSED_SPEC,
        }
    ),
)
def add_schedule(
    name: str,
    principal: Writer,
    session: SessionDep,
    settings: SettingsDep,
    runtime: RuntimeDep,
    via: ViaDep,
    body: Annotated[ScheduleSpec | None, Body()] = None,
) -> ScheduleEnvelope:
    """One more schedule of the pipeline, beside those it has; an empty body takes the
    ``schedule:`` block of its profile."""
    profile, spec = _profile_and_spec(name, body, principal, session, settings, runtime)
    now = utcnow()
    row = create_schedule(
        session, owner=principal.owner, profile=profile, spec=spec, settings=settings, now=now
    )
    record(session, via.actor(principal), "schedule.create", *schedule_event(row), at=now)
    envelope = _envelope(session, row)
    session.commit()
    return envelope


@router.get("/pipelines/{name}/schedules", response_model=ScheduleList)
def pipeline_schedules(name: str, principal: Reader, session: SessionDep) -> ScheduleList:
    """The key owner's schedules of the pipeline, unnamed first, then by name; empty when it
    has none, as ``GET /v1/schedules`` is."""
    summaries = list_schedules(session, owner=principal.owner, pipeline=name)
    return ScheduleList(schedules=[SchedulePublic.of(summary) for summary in summaries])


@router.get(
    "/pipelines/{name}/schedules/{schedule}",
    response_model=ScheduleEnvelope,
    responses=_NOT_FOUND,
)
def read_one_schedule(
    name: str, schedule: str, principal: Reader, session: SessionDep
) -> ScheduleEnvelope:
    """``schedule`` is the schedule's id or its name."""
    row = get_schedule(session, owner=principal.owner, pipeline=name, schedule=schedule)
    return _envelope(session, row)


@router.put(
    "/pipelines/{name}/schedules/{schedule}",
    response_model=ScheduleEnvelope,
    responses={
        201: {"model": ScheduleEnvelope, "description": "a schedule of that name was created"},
        **errors(
            {
                404: "pipeline_not_found, schedule_not_found",
                409: "schedule_limit_reached, schedule_name_taken",
                422: f"{_REFUSED_SPEC}, schedule_name_mismatch",
            }
        ),
    },
)
def replace_schedule(
    name: str,
    schedule: str,
    response: Response,
    principal: Writer,
    session: SessionDep,
    settings: SettingsDep,
    runtime: RuntimeDep,
    via: ViaDep,
    body: Annotated[ScheduleSpec | None, Body()] = None,
) -> ScheduleEnvelope:
    """Replace a schedule by id or name, or create it (201) under a name the pipeline has no
    schedule of yet, so a named schedule can be declared twice alike. A body without ``name``
    keeps the schedule's name; one with another name renames it (refused on creation)."""
    profile, spec = _profile_and_spec(name, body, principal, session, settings, runtime)
    now = utcnow()
    row, created = set_schedule(
        session,
        owner=principal.owner,
        profile=profile,
        schedule=schedule,
        spec=spec,
        settings=settings,
        now=now,
    )
    record(session, via.actor(principal), schedule_saved(row, now), *schedule_event(row), at=now)
    envelope = _envelope(session, row)
    session.commit()
    if created:
        response.status_code = 201
    return envelope


@router.delete("/pipelines/{name}/schedules/{schedule}", status_code=204, responses=_NOT_FOUND)
def remove_one_schedule(
    name: str, schedule: str, principal: Writer, session: SessionDep, via: ViaDep
) -> Response:
    """By id or name; the jobs it started stay."""
    row = delete_schedule(session, owner=principal.owner, pipeline=name, schedule=schedule)
    record(session, via.actor(principal), "schedule.delete", *schedule_event(row))
    session.commit()
    return Response(status_code=204)


@router.get("/schedules", response_model=ScheduleList)
def all_schedules(principal: Reader, session: SessionDep) -> ScheduleList:
    """With next and last fire, the last run's status and how many runs it started."""
    summaries = list_schedules(session, owner=_visible_to(principal))
    return ScheduleList(schedules=[SchedulePublic.of(summary) for summary in summaries])
