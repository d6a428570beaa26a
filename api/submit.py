"""Accepting a job: the one path that the jobs route and the MCP tools share.

The job is committed before its first message is published, so a worker never receives a
message for a job that PostgreSQL does not hold yet.
"""

import logging
import re
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from api.schemas import JobCreate, JobPublic
from service import logs
from service.auth import Principal
from service.db import autocommit
from service.egress import check_escalation_urls, check_notify_url
from service.jobs import JobRequest, check_open_jobs, job_view, new_job_view, submit_job
from service.notices import validate_notify_url
from service.plan import initial_plan
from service.profiles import NAME_PATTERN, load_profile_text, validate_profile
from service.runtime import Runtime
from service.settings import Settings
from service.snapshots import job_profile
from tasks.dispatch import publish_new_job

if TYPE_CHECKING:
    from celery import Celery

log = logging.getLogger(__name__)


def _pipeline(
    body: JobCreate, known_actions: frozenset[str], settings: Settings
) -> str | dict[str, Any]:
    """A string that is not a pipeline name is inline profile text (YAML, or JSON as YAML).
    An inline profile's escalation URLs are checked here, as a saved pipeline's are."""
    pipeline = body.pipeline
    if isinstance(pipeline, str):
        if re.fullmatch(NAME_PATTERN, pipeline) or not (
            "\n" in pipeline or pipeline.lstrip().startswith("{")
        ):
            return pipeline
        profile = load_profile_text(pipeline, source="inline", known_actions=known_actions)
    else:
        profile = validate_profile(dict(pipeline), source="inline", known_actions=known_actions)
    check_escalation_urls(settings, profile)
    return profile.to_json()


def accept_job(
    body: JobCreate,
    principal: Principal,
    session: Session,
    runtime: Runtime,
    settings: Settings,
    celery_app: "Celery",
) -> tuple[JobPublic, int]:
    """The job and 202 when it is new, or the first job and 200 when its idempotency key was
    seen before."""
    known_actions = runtime.registry.names()
    request = JobRequest(
        pipeline=_pipeline(body, known_actions, settings),
        params=body.params,
        idempotency_key=body.idempotency_key,
        diff_mode=body.diff_mode,
        notify_url=body.notify_url,
    )
    if body.notify_url is not None:
        check_notify_url(settings, validate_notify_url(body.notify_url))
    autocommit(session)
    check_open_jobs(session, principal.owner, settings.max_open_jobs_per_owner)
    job, created = submit_job(
        session,
        request,
        owner=principal.owner,
        profiles_dir=settings.profiles_dir,
        known_actions=known_actions,
    )
    session.commit()
    with logs.bound(job_id=str(job.id)):
        if not created:
            log.info("job %s seen before (idempotency key), not submitted again", job.id)
            return JobPublic.of(job_view(session, job)), 200
        profile = job_profile(job)
        publish_new_job(celery_app, runtime, initial_plan(profile, job.id))
        log.info("job submitted: pipeline %s by %s", profile.name, principal.owner)
    return JobPublic.of(new_job_view(job, profile)), 202
