"""Job routes. Each write commits its transaction before anything is sent to the broker, so a
worker can never receive a message for a job that PostgreSQL does not hold yet."""

import logging
import re
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from kombu.exceptions import OperationalError as KombuOperationalError
from redis.exceptions import RedisError

from api.deps import CeleryDep, Reader, RuntimeDep, SessionDep, SettingsDep, Writer
from api.errors import ApiError
from api.schemas import ErrorEnvelope, JobCreate, JobEnvelope, JobList, JobPublic
from service.auth import Principal
from service.clock import utcnow
from service.constants import JOB_LIST_DEFAULT_LIMIT, JOB_LIST_MAX_LIMIT
from service.db import autocommit
from service.errors import JobNotFound
from service.jobs import (
    JobRequest,
    cancel_job,
    get_job,
    job_view,
    list_jobs,
    new_job_view,
    submit_job,
)
from service.plan import initial_plan
from service.profiles import NAME_PATTERN, load_profile_text
from service.snapshots import job_profile
from service.states import JobStatus
from tasks.dispatch import publish_new_job

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

JOB_STATUSES = frozenset(status.value for status in JobStatus)

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorEnvelope} for status in (400, 401, 403, 404, 409, 413, 422, 503)
}


def _job_id(raw: str) -> uuid.UUID:
    """A malformed id names no job: 404, the same answer as for an id that does not exist."""
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise JobNotFound(f"no job {raw}", {"job_id": raw}) from None


def _visible_to(principal: Principal) -> str | None:
    """The owner whose jobs the caller may see; ``None`` (every owner) for admin keys."""
    return None if principal.has("admin") else principal.owner


def _pipeline(body: JobCreate, known_actions: frozenset[str]) -> str | dict[str, Any]:
    """A string that is not a pipeline name is inline profile text (YAML, or JSON as YAML)."""
    pipeline = body.pipeline
    if (
        isinstance(pipeline, str)
        and not re.fullmatch(NAME_PATTERN, pipeline)
        and ("\n" in pipeline or pipeline.lstrip().startswith("{"))
    ):
        profile = load_profile_text(pipeline, source="inline", known_actions=known_actions)
        return profile.to_json()
    return pipeline


@router.post(
    "",
    status_code=202,
    response_model=JobEnvelope,
    responses={200: {"model": JobEnvelope}, **_ERRORS},
)
def create_job(
    body: JobCreate,
    principal: Writer,
    session: SessionDep,
    runtime: RuntimeDep,
    settings: SettingsDep,
    celery_app: CeleryDep,
) -> Response:
    """202 for a new job; 200 with the first job when the idempotency key was seen before.

    The envelope is serialised here, on the request's worker thread: returned as a model, it
    would be validated again on a second trip to the thread pool."""
    known_actions = runtime.registry.names()
    request = JobRequest(
        pipeline=_pipeline(body, known_actions),
        params=body.params,
        idempotency_key=body.idempotency_key,
        diff_mode=body.diff_mode,
        notify_url=body.notify_url,
    )
    autocommit(session)
    job, created = submit_job(
        session,
        request,
        owner=principal.owner,
        profiles_dir=settings.profiles_dir,
        known_actions=known_actions,
    )
    session.commit()
    if not created:
        return _envelope(JobPublic.of(job_view(session, job)), 200)
    profile = job_profile(job)
    publish_new_job(celery_app, runtime, initial_plan(profile, job.id))
    return _envelope(JobPublic.of(new_job_view(job, profile)), 202)


def _envelope(job: JobPublic, status_code: int) -> Response:
    body = JobEnvelope(job=job).model_dump_json()
    return Response(body, status_code=status_code, media_type="application/json")


@router.get("/{job_id}", response_model=JobEnvelope, responses=_ERRORS)
def read_job(job_id: str, principal: Reader, session: SessionDep) -> JobEnvelope:
    job = get_job(session, _job_id(job_id), owner=_visible_to(principal))
    return JobEnvelope(job=JobPublic.of(job_view(session, job)))


def _statuses(raw: list[str]) -> list[str]:
    statuses = [part.strip() for value in raw for part in value.split(",") if part.strip()]
    unknown = sorted(set(statuses) - JOB_STATUSES)
    if unknown:
        raise ApiError(
            "invalid_query",
            f"unknown job status {unknown[0]!r}",
            {"param": "status", "unknown": unknown, "allowed": sorted(JOB_STATUSES)},
        )
    return list(dict.fromkeys(statuses))


@router.get("", response_model=JobList, responses=_ERRORS)
def search_jobs(
    principal: Reader,
    session: SessionDep,
    pipeline: Annotated[str | None, Query(max_length=64)] = None,
    status: Annotated[list[str] | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=JOB_LIST_MAX_LIMIT)] = JOB_LIST_DEFAULT_LIMIT,
    cursor: Annotated[str | None, Query(max_length=512)] = None,
) -> JobList:
    """Newest first. ``status`` may repeat or be comma-separated; ``next_cursor`` pages on."""
    jobs, next_cursor = list_jobs(
        session,
        owner=_visible_to(principal),
        pipeline=pipeline or None,
        statuses=_statuses(status or []),
        limit=limit,
        cursor=cursor or None,
    )
    return JobList(
        jobs=[JobPublic.of(job_view(session, job)) for job in jobs], next_cursor=next_cursor
    )


@router.post("/{job_id}/cancel", response_model=JobEnvelope, responses=_ERRORS)
def cancel(
    job_id: str, principal: Writer, session: SessionDep, celery_app: CeleryDep
) -> JobEnvelope:
    """Cancelling a cancelled job is a no-op; cancelling a finished one is a 409. Running tasks
    are revoked only after the commit, and only as a courtesy: the cancelled status in
    PostgreSQL is what stops them at their next checkpoint even if the revoke is lost."""
    job, running = cancel_job(session, _job_id(job_id), owner=_visible_to(principal), now=utcnow())
    session.commit()
    envelope = JobEnvelope(job=JobPublic.of(job_view(session, job)))
    session.commit()
    if running:
        try:
            celery_app.control.revoke(running, terminate=True, signal="SIGUSR1")
        except (KombuOperationalError, RedisError, OSError) as exc:
            log.warning("could not revoke tasks %s of job %s: %s", running, job.id, exc)
    return envelope
