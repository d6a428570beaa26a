"""Step logs: ``/v1/jobs/{id}/steps/{step_id}/logs``, a page of a step's lines, or with
``follow=true`` the same lines then live ones, framed as the job event stream frames its
events (SSE or NDJSON, chosen by the ``Accept`` header)."""

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from api.deps import Reader, RuntimeDep, SessionDep, SettingsDep
from api.errors import ApiError
from api.openapi import errors
from api.routes.jobs import parse_job_id, visible_to
from api.schemas import LogLinePublic, LogPage
from api.streams import NDJSON, SSE, Framing, LogFilter, listener_of, log_stream
from service.engine.events import job_settled
from service.engine.steplogs import step_lines
from service.platform.constants import STEP_LOG_PAGE_MAX_ROWS, STEP_LOG_PAGE_ROWS

router = APIRouter(tags=["jobs"])

_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_PAGE_OR_STREAM: dict[int | str, dict[str, Any]] = {
    200: {
        "description": (
            "Without `follow`: a page of lines, oldest first, and `next_after` to ask for the "
            "next. With `follow=true`: the lines, then live ones until the job is settled. "
            "SSE: `id:` is the line's `id`, `data:` one line as JSON, `: keep-alive` comments "
            "while nothing happens, `event: end` once the job is settled. NDJSON: one line a "
            "line, blank lines as keep-alives."
        ),
        "content": {
            "application/json": {"schema": LogPage.model_json_schema()},
            SSE: {"schema": {"type": "string"}},
            NDJSON: {"schema": LogLinePublic.model_json_schema()},
        },
    },
}


def _resume_point(last_event_id: str | None, after: int) -> int:
    if last_event_id is None:
        return after
    try:
        return max(int(last_event_id), after)
    except ValueError:
        raise ApiError(
            "invalid_query",
            "Last-Event-ID must be the id of a line of this log",
            {"header": "Last-Event-ID"},
        ) from None


@router.get(
    "/v1/jobs/{job_id}/steps/{step_id}/logs",
    response_model=LogPage,
    response_class=JSONResponse,
    responses={
        **_PAGE_OR_STREAM,
        **errors(
            {
                400: "invalid_query",
                404: "job_not_found, step_not_found",
                410: "job_expired: pruned by retention (details: pruned_at, finished_at)",
            }
        ),
    },
)
async def read_step_logs(
    request: Request,
    job_id: str,
    step_id: str,
    principal: Reader,
    session: SessionDep,
    runtime: RuntimeDep,
    settings: SettingsDep,
    attempt: Annotated[int | None, Query(ge=1, description="only this attempt's lines")] = None,
    after: Annotated[int, Query(ge=0, description="lines after the line with this id")] = 0,
    limit: Annotated[int, Query(ge=1, le=STEP_LOG_PAGE_MAX_ROWS)] = STEP_LOG_PAGE_ROWS,
    follow: Annotated[bool, Query(description="then follow live until the job is settled")] = False,
    accept: Annotated[str | None, Header()] = None,
    last_event_id: Annotated[str | None, Header()] = None,
) -> Response:
    """What a step's attempts logged and printed (``ctx.log``, ``logging``, ``print``),
    every shard and round of it, each attempt's log cut at ``FLOWBEAT_STEP_LOG_MAX_BYTES``.
    A follower's reconnect (``Last-Event-ID``) to a settled job with no newer line answers
    204, which tells an EventSource to stop, as the job's event stream does."""
    key = parse_job_id(job_id)
    start = _resume_point(last_event_id, after)
    lines = await run_in_threadpool(
        step_lines,
        session,
        key,
        step_id,
        owner=visible_to(principal),
        attempt=attempt,
        after=start,
        limit=1 if follow else limit,
    )
    if not follow:
        await run_in_threadpool(session.close)
        return JSONResponse(LogPage.of(lines, start, limit).model_dump(mode="json"))
    reconnected = last_event_id is not None and not lines
    if reconnected and await run_in_threadpool(job_settled, session, key):
        return Response(status_code=204)
    await run_in_threadpool(session.close)
    framing = Framing(sse=SSE in (accept or ""))
    stream = log_stream(
        runtime,
        await run_in_threadpool(listener_of, request.app),
        LogFilter(key, step_id, attempt),
        start,
        framing,
        settings.event_keepalive_s,
    )
    return StreamingResponse(stream, media_type=SSE if framing.sse else NDJSON, headers=_HEADERS)
