"""Job routes. Each write commits its transaction before anything is sent to the broker, so a
worker can never receive a message for a job that PostgreSQL does not hold yet."""

import uuid
from datetime import datetime
from typing import Annotated, Literal

from celery import Celery
from fastapi import APIRouter, FastAPI, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from api.deps import CeleryDep, Reader, RuntimeDep, SessionDep, SettingsDep, ViaDep, Writer
from api.errors import ApiError
from api.openapi import errors
from api.schemas import JobCreate, JobEnvelope, JobList, JobPublic, JobSubmitted, RerunCreate
from api.streams import listener_of, wait_until_final
from api.submit import Accepted, LoopIO, accept_job, accept_job_on_loop
from service.engine.filters import JobFilter
from service.engine.jobs import cancel_job, get_job, job_view, list_jobs
from service.engine.reruns import RerunRequest, rerun_job
from service.engine.runtime import Runtime
from service.language.labels import parse_labels
from service.language.plan import JobPlan, load_plan
from service.platform.audit import Actor, record_cancel, record_rerun
from service.platform.auth import Principal
from service.platform.clock import utcnow
from service.platform.constants import JOB_LIST_DEFAULT_LIMIT, JOB_LIST_MAX_LIMIT
from service.platform.errors import JobNotFound
from service.platform.settings import Settings
from service.platform.states import JOB_FINAL, JobStatus
from tasks.dispatch import publish_new_job, publish_or_defer, revoke_unstarted

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

JOB_STATUSES = frozenset(status.value for status in JobStatus)

NOT_FOUND = errors(
    {
        404: "job_not_found",
        410: "job_expired: pruned by retention (details: pruned_at, finished_at)",
    }
)


def parse_job_id(raw: str) -> uuid.UUID:
    """A malformed id names no job: 404, the same answer as for an id that does not exist."""
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise JobNotFound(f"no job {raw}", {"job_id": raw}) from None


def visible_to(principal: Principal) -> str | None:
    """The owner whose jobs the caller may see; ``None`` (every owner) for admin keys."""
    return None if principal.has("admin") else principal.owner


@router.post(
    "",
    status_code=202,
    response_model=JobSubmitted,
    responses={
        200: {"model": JobSubmitted},
        **errors(
            {
                404: "pipeline_not_found",
                409: "idempotency_conflict, duplicate_job: the pipeline's dedupe key matched "
                "an open or recent job (details: job_id) under on_duplicate: reject",
                422: "validation_error, params_invalid, profile_invalid, notify_url_invalid, "
                "egress_refused",
                429: "open_jobs_limit: the owner has FLOWBEAT_MAX_OPEN_JOBS_PER_OWNER open jobs",
                503: "database_unavailable, broker_unavailable",
            }
        ),
    },
)
async def create_job(
    request: Request, body: JobCreate, principal: Writer, runtime: RuntimeDep, via: ViaDep
) -> Response:
    """202 for a new job; 200 with the first job when the idempotency key was seen before
    (within ``FLOWBEAT_IDEMPOTENCY_TTL_S``); 200 with ``deduplicated: true`` and the job it
    duplicates when the pipeline's dedupe key matches an open or recent one.

    With ``"mode": "sync"`` the request waits, up to ``wait_s``, for the job to be final:
    200 with the final job, else 202 with the job as it stands."""
    job, status_code, deduplicated = await accept(
        request.app, body, principal, via.actor(principal)
    )
    if body.mode == "async" or job.status in JOB_FINAL:
        return job_response(job, status_code, deduplicated)
    listener = await run_in_threadpool(listener_of, request.app)
    await wait_until_final(runtime, listener, job.id, body.wait_s)
    job = await run_in_threadpool(_read, runtime, job.id)
    return job_response(job, 200 if job.status in JOB_FINAL else 202, deduplicated)


async def accept(app: FastAPI, body: JobCreate, principal: Principal, actor: Actor) -> Accepted:
    """On the event loop where the job can be taken there, else in the thread pool. The route
    and ``api.lane.SubmitLane`` both accept jobs through here; ``actor`` is recorded with a
    new job, in the statement that stores it."""
    state = app.state
    io: LoopIO | None = state.loop_io
    if io is not None:
        accepted = await accept_job_on_loop(
            body, principal, state.runtime, state.settings, io, actor
        )
        if accepted is not None:
            return accepted
    return await run_in_threadpool(
        _accept, body, principal, state.runtime, state.settings, state.celery_app, actor
    )


def _accept(
    body: JobCreate,
    principal: Principal,
    runtime: Runtime,
    settings: Settings,
    celery_app: Celery,
    actor: Actor,
) -> Accepted:
    """``accept_job`` in a session of its own: a job accepted on the event loop needs none,
    and the session a route declares is made for every request."""
    with runtime.sessions() as session:
        return accept_job(body, principal, session, runtime, settings, celery_app, actor)


def _read(runtime: Runtime, job_id: uuid.UUID) -> JobPublic:
    with runtime.sessions() as session:
        return JobPublic.of(job_view(session, get_job(session, job_id)))


def job_response(job: JobPublic, status_code: int, deduplicated: bool = False) -> Response:
    body = JobSubmitted(job=job, deduplicated=deduplicated).model_dump_json()
    return Response(body, status_code=status_code, media_type="application/json")


@router.get("/{job_id}", response_model=JobEnvelope, responses=NOT_FOUND)
def read_job(job_id: str, principal: Reader, session: SessionDep) -> JobEnvelope:
    job = get_job(session, parse_job_id(job_id), owner=visible_to(principal))
    return JobEnvelope(job=JobPublic.of(job_view(session, job)))


def job_statuses(raw: list[str]) -> list[str]:
    statuses = [part.strip() for value in raw for part in value.split(",") if part.strip()]
    unknown = sorted(set(statuses) - JOB_STATUSES)
    if unknown:
        raise ApiError(
            "invalid_query",
            f"unknown job status {unknown[0]!r}",
            {"param": "status", "unknown": unknown, "allowed": sorted(JOB_STATUSES)},
        )
    return list(dict.fromkeys(statuses))


@router.get(
    "",
    response_model=JobList,
    responses=errors({400: "invalid_query, invalid_cursor, job_filter_invalid"}),
)
def search_jobs(
    principal: Reader,
    session: SessionDep,
    pipeline: Annotated[str | None, Query(max_length=64)] = None,
    status: Annotated[list[str] | None, Query()] = None,
    label: Annotated[list[str] | None, Query(max_length=320)] = None,
    error_code: Annotated[str | None, Query(max_length=64)] = None,
    since: Annotated[datetime | None, Query()] = None,
    until: Annotated[datetime | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=JOB_LIST_MAX_LIMIT)] = JOB_LIST_DEFAULT_LIMIT,
    cursor: Annotated[str | None, Query(max_length=512)] = None,
    compensation: Annotated[Literal["failed"] | None, Query()] = None,
    parent: Annotated[uuid.UUID | None, Query()] = None,
) -> JobList:
    """Newest first. ``status`` may repeat or be comma-separated; ``label=key:value`` may
    repeat, and a job must have every label given; ``error_code`` the code of a job's error;
    ``since`` (included) and ``until`` (excluded) bound when it was created, with a time zone;
    ``next_cursor`` pages on; ``compensation=failed`` lists the jobs whose undoing needs an
    operator; ``parent`` the jobs that came from that job: its children, its reruns and the
    jobs its success started (each job's ``parent.relation`` says which)."""
    match = JobFilter(
        pipeline=pipeline or None,
        statuses=tuple(job_statuses(status or [])),
        labels=parse_labels(label or []),
        error_code=error_code or None,
        since=since,
        until=until,
        compensation_failed=compensation == "failed",
        parent=parent,
    )
    jobs, next_cursor = list_jobs(
        session, owner=visible_to(principal), match=match, limit=limit, cursor=cursor or None
    )
    return JobList(
        jobs=[JobPublic.of(job_view(session, job)) for job in jobs], next_cursor=next_cursor
    )


@router.post(
    "/{job_id}/cancel",
    response_model=JobEnvelope,
    responses=errors({404: "job_not_found", 409: "job_conflict: the job is already finished"}),
)
def cancel(
    job_id: str,
    principal: Writer,
    session: SessionDep,
    runtime: RuntimeDep,
    celery_app: CeleryDep,
    via: ViaDep,
) -> JobEnvelope:
    """Cancelling a cancelled job is a no-op; cancelling a finished one is a 409. Its tasks are
    revoked only after the commit, and only as a courtesy to messages not yet started: the
    cancelled status in PostgreSQL is what stops a running step, at its worker's next heartbeat,
    even if the revoke is lost."""
    now = utcnow()
    job, running = cancel_job(session, parse_job_id(job_id), owner=visible_to(principal), now=now)
    record_cancel(session, via.actor(principal), job, now)
    session.commit()
    view = job_view(session, job)
    envelope = JobEnvelope(job=JobPublic.of(view))
    session.commit()
    if view.compensation is not None and view.compensation["status"] == "running":
        publish_or_defer(celery_app, runtime, JobPlan(job.id, compensate=True))
    revoke_unstarted(celery_app, running)
    return envelope


@router.post(
    "/{job_id}/rerun",
    status_code=202,
    response_model=JobEnvelope,
    responses=errors(
        {
            400: "unknown_step",
            404: "job_not_found",
            409: "job_conflict, pipeline_version_gone",
            422: "validation_error, rerun_invalid, params_invalid",
            429: "open_jobs_limit: the owner has FLOWBEAT_MAX_OPEN_JOBS_PER_OWNER open jobs",
        }
    ),
)
def rerun(
    job_id: str,
    body: RerunCreate,
    principal: Writer,
    session: SessionDep,
    runtime: RuntimeDep,
    celery_app: CeleryDep,
    settings: SettingsDep,
    via: ViaDep,
) -> JobEnvelope:
    """A new job of the parent's profile that reuses the checkpoints of the steps upstream of
    ``from_step``; it is stored before its first steps are sent."""
    request = RerunRequest(
        from_step=body.from_step,
        params=body.params,
        reuse_upstream=body.reuse_upstream,
        only_failed_items=body.only_failed_items,
        priority=body.priority,
    )
    job = rerun_job(
        session,
        parse_job_id(job_id),
        request,
        visible_to=visible_to(principal),
        now=utcnow(),
        open_jobs_limit=settings.max_open_jobs_per_owner,
        fair_share_ahead=settings.fair_share_ahead,
    )
    record_rerun(session, via.actor(principal), job, body.from_step)
    session.commit()
    plan = load_plan(session, job.id)
    session.commit()
    if plan is not None and job.waiting_for is None:
        publish_new_job(celery_app, runtime, plan)
    return JobEnvelope(job=JobPublic.of(job_view(session, job)))
