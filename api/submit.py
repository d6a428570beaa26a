"""Accepting a job: the one path that the jobs route and the MCP tools share.

The job is committed before its first message is published, so a worker never receives a
message for a job that PostgreSQL does not hold yet.
"""

import logging
import re
from collections.abc import Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import psycopg
import redis.asyncio
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from sqlalchemy.orm import Session

from api.batching import Coalescer
from api.schemas import JobCreate, JobPublic
from service.catalogue.notices import validate_notify_url
from service.catalogue.resolution import seen_resolution
from service.engine.intake import NewJob, insert_jobs_if_resolved, new_job, plan_once
from service.engine.jobs import job_view, new_job_view
from service.engine.runtime import Runtime
from service.engine.submission import JobRequest, Outcome, submit_job
from service.language.checks import validate_profile
from service.language.escalations import check_escalation_urls
from service.language.loading import load_profile_text
from service.language.plan import JobPlan, initial_plan
from service.language.snapshots import job_profile, profile_secrets
from service.language.specs import NAME_PATTERN
from service.platform import logs, tracing
from service.platform.audit import Actor
from service.platform.auth import Principal
from service.platform.constants import API_JOB_BATCH_MAX, API_LOOP_DB_WAIT_S
from service.platform.db import autocommit, connect_kwargs, libpq_url
from service.platform.egress import check_notify_url
from service.platform.errors import FlowbeatError
from service.platform.models import JobRow
from service.platform.secrets import secrets_of
from service.platform.settings import Settings
from tasks.dispatch import publish_new_jobs_async, send_new_job
from tasks.messages import DIRECT_BROKER_SCHEMES, async_broker_client

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

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


class Accepted(NamedTuple):
    """The answer to a submission: its job, the status code, and whether the job is another's
    that the submission duplicates (its pipeline's dedupe window)."""

    job: JobPublic
    status_code: int
    deduplicated: bool = False


def accept_job(
    body: JobCreate,
    principal: Principal,
    session: Session,
    runtime: Runtime,
    settings: Settings,
    celery_app: "Celery",
    actor: Actor,
) -> Accepted:
    """The job and 202 when it is new; the first job and 200 when its idempotency key was
    seen before; the open or recent job it duplicates and 200, deduplicated, when its
    pipeline's dedupe key matches one (or ``DuplicateJob`` under ``on_duplicate: reject``).
    A new job's audit event, by ``actor``, is stored by the job's own statement."""
    known_actions = runtime.registry.names()
    request = JobRequest(
        pipeline=_pipeline(body, known_actions, settings),
        params=body.params,
        idempotency_key=body.idempotency_key,
        diff_mode=body.diff_mode,
        refresh=body.refresh,
        priority=body.priority,
        notify_url=body.notify_url,
        labels=body.labels,
    )
    if body.notify_url is not None:
        check_notify_url(settings, validate_notify_url(body.notify_url))
    autocommit(session)
    job, outcome = submit_job(
        session,
        request,
        owner=principal.owner,
        profiles_dir=settings.profiles_dir,
        known_actions=known_actions,
        open_jobs_limit=settings.max_open_jobs_per_owner,
        fair_share_ahead=settings.fair_share_ahead,
        secrets=secrets_of(settings),
        audit=actor,
        idempotency_ttl_s=settings.idempotency_ttl_s,
    )
    session.commit()
    with (
        logs.bound(job_id=str(job.id)),
        tracing.span("job.submit", job_id=str(job.id), pipeline=job.pipeline),
    ):
        if outcome is Outcome.REPLAYED:
            log.info("job %s seen before (idempotency key), not submitted again", job.id)
            return Accepted(JobPublic.of(job_view(session, job)), 200)
        if outcome is Outcome.DEDUPLICATED:
            log.info("job %s has the same dedupe key, not submitted again", job.id)
            return Accepted(JobPublic.of(job_view(session, job)), 200, deduplicated=True)
        profile = job_profile(job)
        if send_new_job(celery_app, runtime, job):
            log.info("job submitted: pipeline %s by %s", profile.name, principal.owner)
        else:
            log.info("job %s waits for %s", job.id, job.waiting_for)
    return Accepted(JobPublic.of(new_job_view(job, profile)), 202)


@dataclass(frozen=True)
class Submission:
    job: NewJob
    plan: JobPlan


@dataclass(frozen=True)
class LoopIO:
    """PostgreSQL and the broker for the event loop that opened them, and the jobs queued up
    for them."""

    pool: AsyncConnectionPool
    broker: redis.asyncio.Redis
    jobs: Coalescer[Submission, bool]


@asynccontextmanager
async def loop_io(
    settings: Settings, runtime: Runtime, celery_app: "Celery"
) -> "AsyncIterator[LoopIO | None]":
    """``None`` where jobs are not pushed without Celery (a broker other than Redis, plain or
    Sentinel): every job goes the thread's way."""
    broker_url = settings.broker_url
    if broker_url is None or not broker_url.startswith(DIRECT_BROKER_SCHEMES):
        yield None
        return
    url = settings.require_database_url()
    pool = AsyncConnectionPool(
        libpq_url(url),
        min_size=0,
        max_size=settings.api_db_pool_size,
        kwargs={"autocommit": True, **connect_kwargs(url, settings.database_pooled)},
        configure=None if settings.database_pooled else plan_once,
        timeout=API_LOOP_DB_WAIT_S,
        open=False,
    )
    await pool.open(wait=False)
    broker = async_broker_client(settings.broker())

    async def store_and_send(batch: Sequence[Submission]) -> list[bool | BaseException]:
        """For each job: whether it was stored (and sent, unless it waits for a slot of its
        concurrency key), or the error its caller raises. A
        value PostgreSQL refuses (text with a NUL), or a saved pipeline deleted while its job
        was being stored, fails the whole statement; the jobs are then stored one by one, so
        only the request it concerns is refused. A batch PostgreSQL picks to break a deadlock
        (its key locks met a transaction that took two of them the other way round) is left
        to ``accept_job``, which takes one key at a time."""
        try:
            async with pool.connection() as conn:
                stored = await insert_jobs_if_resolved(
                    conn,
                    [s.job for s in batch],
                    open_jobs_limit=settings.max_open_jobs_per_owner,
                )
        except (PoolTimeout, psycopg.errors.DeadlockDetected):
            return [False] * len(batch)
        except (psycopg.DataError, psycopg.IntegrityError) as exc:
            if len(batch) == 1:
                return [exc]
            return [answer for s in batch for answer in await store_and_send([s])]
        sent = [s for s in batch if s.job.id in stored and s.job.values["waiting_for"] is None]
        outcomes = await publish_new_jobs_async(celery_app, runtime, broker, [s.plan for s in sent])
        failed = {s.job.id: o for s, o in zip(sent, outcomes, strict=True) if o is not None}
        return [failed.get(s.job.id, s.job.id in stored) for s in batch]

    try:
        yield LoopIO(pool, broker, Coalescer(store_and_send, API_JOB_BATCH_MAX))
    finally:
        await broker.aclose()
        await pool.close()


async def accept_job_on_loop(
    body: JobCreate,
    principal: Principal,
    runtime: Runtime,
    settings: Settings,
    io: LoopIO,
    actor: Actor,
) -> Accepted | None:
    """A new job of a pipeline name, accepted without leaving the event loop: the hop to the
    thread pool, the session and the separate lookup, count and insert were most of what the
    API spent on a job, and jobs that arrive together are stored and sent together. ``None``
    when it cannot be taken this way (an inline profile, a notify URL, a name not resolved here
    before or resolving differently now, the open-jobs cap reached, an idempotency key already
    taken, a dedupe key matched, a request ``submit_job`` refuses, no free connection):
    ``accept_job`` then decides,
    and answers exactly as it always has."""
    name = body.pipeline
    if not isinstance(name, str) or body.notify_url is not None or settings.fair_share_ahead:
        return None
    if not re.fullmatch(NAME_PATTERN, name):
        return None
    known_actions = runtime.registry.names()
    resolved = seen_resolution(
        name,
        owner=principal.owner,
        profiles_dir=settings.profiles_dir,
        known_actions=known_actions,
    )
    if resolved is None:
        return None
    request = JobRequest(
        pipeline=name,
        params=body.params,
        idempotency_key=body.idempotency_key,
        diff_mode=body.diff_mode,
        refresh=body.refresh,
        priority=body.priority,
        labels=body.labels,
    )
    try:
        secrets_of(settings).require(profile_secrets(resolved.profile), principal.owner)
        job = new_job(request, resolved, owner=principal.owner, name=name, audit=actor)
    except FlowbeatError:
        return None
    profile = resolved.profile
    with (
        logs.bound(job_id=str(job.id)),
        tracing.span("job.submit", job_id=str(job.id), pipeline=profile.name),
    ):
        plan = initial_plan(profile, job.id, job.priority, tracing.traceparent())
        job.values["traceparent"] = plan.trace
        if not await io.jobs.submit(Submission(job, plan)):
            return None
        log.info("job submitted: pipeline %s by %s", profile.name, principal.owner)
    return Accepted(JobPublic.of(new_job_view(JobRow(**job.values), profile)), 202)
