"""Live event streams: one job's (``/v1/jobs/{id}/events``) and every readable job's
(``/v1/events``), as Server-Sent Events or NDJSON, chosen by the ``Accept`` header."""

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from api.deps import Reader, RuntimeDep, SessionDep, SettingsDep
from api.errors import ApiError
from api.openapi import errors
from api.routes.jobs import parse_job_id, visible_to
from api.schemas import EventPublic
from api.streams import (
    NDJSON,
    SSE,
    Framing,
    Scope,
    all_jobs_stream,
    job_stream,
    listener_of,
)
from service.engine.events import events_after, job_settled
from service.engine.jobs import get_job
from service.platform.clock import utcnow

router = APIRouter(tags=["events"])

_STREAM: dict[int | str, dict[str, Any]] = {
    200: {
        "description": (
            "The events, oldest first, then live ones. SSE: `id:` is the event's `seq` "
            "(per-job stream) or its time (all-jobs stream), `data:` one event as JSON; "
            "`: keep-alive` comments while nothing happens; `event: end` once the job is "
            "settled. NDJSON: one event a line, blank lines as keep-alives."
        ),
        "content": {
            SSE: {"schema": {"type": "string"}},
            NDJSON: {"schema": EventPublic.model_json_schema()},
        },
    },
}
_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _framing(accept: str | None) -> Framing:
    return Framing(sse=SSE in (accept or ""))


def _resume_point(last_event_id: str | None, after: int | None) -> int:
    if last_event_id is None:
        return after or 0
    try:
        seq = int(last_event_id)
    except ValueError:
        raise ApiError(
            "invalid_query",
            "Last-Event-ID must be the seq of an event of this job",
            {"header": "Last-Event-ID"},
        ) from None
    return max(seq, after or 0)


@router.get(
    "/v1/jobs/{job_id}/events",
    response_class=StreamingResponse,
    responses={
        **_STREAM,
        **errors(
            {
                400: "invalid_query",
                404: "job_not_found",
                410: "job_expired: pruned by retention (details: pruned_at, finished_at)",
            }
        ),
    },
)
async def stream_job_events(
    request: Request,
    job_id: str,
    principal: Reader,
    session: SessionDep,
    runtime: RuntimeDep,
    settings: SettingsDep,
    after: Annotated[int | None, Query(ge=0, description="replay events after this seq")] = None,
    accept: Annotated[str | None, Header()] = None,
    last_event_id: Annotated[str | None, Header()] = None,
) -> Response:
    """Replays the job's events after ``after`` (or ``Last-Event-ID``), then follows live
    until the job is final and its compensations are done. A reconnect to a settled job with
    nothing new answers 204, which tells an EventSource to stop."""
    key = parse_job_id(job_id)
    owner = visible_to(principal)
    await run_in_threadpool(get_job, session, key, owner=owner)
    start = _resume_point(last_event_id, after)
    if last_event_id is not None:
        settled = await run_in_threadpool(job_settled, session, key)
        newer = await run_in_threadpool(events_after, session, key, start, 1)
        if settled and not newer:
            return Response(status_code=204)
    await run_in_threadpool(session.close)
    framing = _framing(accept)
    stream = job_stream(
        runtime,
        await run_in_threadpool(listener_of, request.app),
        key,
        start,
        framing,
        settings.event_keepalive_s,
    )
    return StreamingResponse(stream, media_type=SSE if framing.sse else NDJSON, headers=_HEADERS)


@router.get(
    "/v1/events",
    response_class=StreamingResponse,
    responses={**_STREAM, **errors({400: "invalid_query"})},
)
async def stream_events(
    request: Request,
    principal: Reader,
    runtime: RuntimeDep,
    settings: SettingsDep,
    pipeline: Annotated[str | None, Query(max_length=64)] = None,
    since: Annotated[
        datetime | None, Query(description="replay from this time (ISO 8601); default: now")
    ] = None,
    accept: Annotated[str | None, Header()] = None,
    last_event_id: Annotated[str | None, Header()] = None,
) -> Response:
    """Every event of the jobs the key may read, from ``since`` (or ``Last-Event-ID``, an
    event time) on, then live, until the client leaves. Resuming by time may repeat events
    of that instant: ``(job_id, seq)`` identifies an event."""
    start = _since(since, last_event_id)
    framing = _framing(accept)
    scope = Scope(owner=visible_to(principal), pipeline=pipeline or None, since=start)
    stream = all_jobs_stream(
        runtime,
        await run_in_threadpool(listener_of, request.app),
        scope,
        framing,
        settings.event_keepalive_s,
    )
    return StreamingResponse(stream, media_type=SSE if framing.sse else NDJSON, headers=_HEADERS)


def _since(since: datetime | None, last_event_id: str | None) -> datetime:
    if last_event_id is not None:
        try:
            since = datetime.fromisoformat(last_event_id)
        except ValueError:
            raise ApiError(
                "invalid_query",
                "Last-Event-ID must be the time of an event of this stream",
                {"header": "Last-Event-ID"},
            ) from None
    if since is None:
        return utcnow()
    if since.tzinfo is None:
        raise ApiError(
            "invalid_query",
            "since must carry a time zone (e.g. 2026-11-24T10:00:00Z)",
            {"param": "since"},
        )
    return since
