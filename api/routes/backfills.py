"""Backfill routes: run a cron schedule's fires over a past range, see how far it got, cancel
it whole. A backfill is stored here and its commit wakes the elected scheduler, which starts
its fires (``service.triggers.backfills.top_up``); nothing is sent from here but the revokes
and compensations of the jobs a cancel ends."""

import uuid

from celery import Celery
from fastapi import APIRouter
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from api.deps import CeleryDep, Reader, RuntimeDep, SessionDep, SettingsDep, ViaDep, Writer
from api.openapi import errors
from api.schemas import UtcDatetime
from service.engine.runtime import Runtime
from service.language.plan import JobPlan
from service.platform.clock import utcnow
from service.triggers.backfills import (
    BackfillProgress,
    BackfillRange,
    Ended,
    cancel_backfill,
    create_backfill,
    find_backfill,
    fires_of,
    list_backfills,
    pipeline_backfills,
    progress,
)
from tasks.dispatch import publish_or_defer, revoke_unstarted

router = APIRouter(prefix="/v1", tags=["schedules"])

_BASE = "/pipelines/{name}/schedules/{schedule}/backfill"
_NOT_FOUND = errors({404: "schedule_not_found, backfill_not_found"})


class BackfillCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    from_: AwareDatetime = Field(
        alias="from", description="the first fire time covered (inclusive), with a time zone"
    )
    to: AwareDatetime = Field(
        description="the end of the range (exclusive), with a time zone, not in the future"
    )
    max_active: int = Field(default=1, description="how many of its jobs may be open at once")


class BackfillFirePublic(BaseModel):
    fire_at: UtcDatetime
    job_id: uuid.UUID | None
    status: str


class BackfillPublic(BaseModel):
    id: uuid.UUID
    schedule_id: uuid.UUID
    pipeline: str
    owner: str
    range_from: UtcDatetime
    range_to: UtcDatetime
    cron: str
    timezone: str
    max_active: int
    status: str
    total: int
    started: int
    skipped: int
    pending: int
    open: int
    jobs: dict[str, int] = Field(description="started jobs by status; error: no job was made")
    cursor: UtcDatetime | None = Field(description="the last fire time handed out")
    created_by: str
    created_at: UtcDatetime
    finished_at: UtcDatetime | None
    fires: list[BackfillFirePublic] | None = Field(
        default=None, description="the fires it started, oldest first (one backfill's only)"
    )

    @classmethod
    def of(cls, view: BackfillProgress) -> "BackfillPublic":
        row = view.backfill
        return cls(
            id=row.id,
            schedule_id=row.schedule_id,
            pipeline=row.pipeline,
            owner=row.owner,
            range_from=row.range_from,
            range_to=row.range_to,
            cron=row.cron,
            timezone=row.timezone,
            max_active=row.max_active,
            status=row.status,
            total=row.total,
            started=view.started,
            skipped=row.skipped,
            pending=view.pending,
            open=view.open,
            jobs=view.jobs,
            cursor=row.cursor,
            created_by=row.created_by,
            created_at=row.created_at,
            finished_at=row.finished_at,
        )


class BackfillEnvelope(BaseModel):
    backfill: BackfillPublic


class BackfillList(BaseModel):
    backfills: list[BackfillPublic]


@router.post(
    _BASE,
    status_code=201,
    response_model=BackfillEnvelope,
    responses=errors(
        {
            404: "schedule_not_found",
            422: "validation_error, backfill_invalid, backfill_too_large, backfill_not_cron",
        }
    ),
)
def start_backfill(
    name: str,
    schedule: str,
    body: BackfillCreate,
    principal: Writer,
    session: SessionDep,
    settings: SettingsDep,
    via: ViaDep,
) -> BackfillEnvelope:
    """One job per fire time of the schedule's cron in ``[from, to)``, in its time zone,
    oldest first, at most ``max_active`` open at once. A fire that has run already, by the
    schedule or another backfill, is skipped; the scheduler leader starts the rest."""
    now = utcnow()
    actor = via.actor(principal)
    row = create_backfill(
        session,
        owner=principal.owner,
        pipeline=name,
        schedule=schedule,
        span=BackfillRange(body.from_, body.to, body.max_active),
        settings=settings,
        actor=actor,
        now=now,
    )
    envelope = BackfillEnvelope(backfill=BackfillPublic.of(progress(session, [row])[0]))
    session.commit()
    return envelope


@router.get(_BASE, response_model=BackfillList, responses=_NOT_FOUND)
def schedule_backfills(
    name: str, schedule: str, principal: Reader, session: SessionDep
) -> BackfillList:
    """The schedule's backfills with their progress, newest first."""
    views = list_backfills(session, owner=principal.owner, pipeline=name, schedule=schedule)
    return BackfillList(backfills=[BackfillPublic.of(view) for view in views])


@router.get("/pipelines/{name}/backfills", response_model=BackfillList)
def all_pipeline_backfills(name: str, principal: Reader, session: SessionDep) -> BackfillList:
    """The backfills of all the pipeline's schedules, newest first; empty when it has none."""
    views = pipeline_backfills(session, owner=principal.owner, pipeline=name)
    return BackfillList(backfills=[BackfillPublic.of(view) for view in views])


@router.get(_BASE + "/{backfill_id}", response_model=BackfillEnvelope, responses=_NOT_FOUND)
def read_backfill(
    name: str, schedule: str, backfill_id: uuid.UUID, principal: Reader, session: SessionDep
) -> BackfillEnvelope:
    """With each fire it started and its job's status."""
    row = find_backfill(
        session, owner=principal.owner, pipeline=name, schedule=schedule, backfill_id=backfill_id
    )
    public = BackfillPublic.of(progress(session, [row])[0])
    public.fires = [
        BackfillFirePublic(fire_at=f.fire_at, job_id=f.job_id, status=f.status)
        for f in fires_of(session, row.id)
    ]
    return BackfillEnvelope(backfill=public)


@router.post(
    _BASE + "/{backfill_id}/cancel",
    response_model=BackfillEnvelope,
    responses=errors({404: "schedule_not_found, backfill_not_found", 409: "backfill_conflict"}),
)
def cancel(
    name: str,
    schedule: str,
    backfill_id: uuid.UUID,
    principal: Writer,
    session: SessionDep,
    runtime: RuntimeDep,
    celery_app: CeleryDep,
    via: ViaDep,
) -> BackfillEnvelope:
    """Start no more of its fires and cancel its open jobs. Cancelling a cancelled backfill
    changes nothing; a completed one is a 409."""
    now = utcnow()
    row, ended = cancel_backfill(
        session,
        owner=principal.owner,
        pipeline=name,
        schedule=schedule,
        backfill_id=backfill_id,
        actor=via.actor(principal),
        now=now,
    )
    envelope = BackfillEnvelope(backfill=BackfillPublic.of(progress(session, [row])[0]))
    session.commit()
    send_cancels(celery_app, runtime, ended)
    return envelope


def send_cancels(app: Celery, runtime: Runtime, ended: Ended) -> None:
    """After the commit: compensations of cancelled sagas, and a courtesy revoke of their
    tasks (the cancelled status is what stops them)."""
    for job_id in ended.compensate:
        publish_or_defer(app, runtime, JobPlan(job_id, compensate=True))
    revoke_unstarted(app, ended.revoke)
