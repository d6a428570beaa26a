"""The job dashboard under ``/ui``: server-rendered pages over the same route functions as the
JSON API, so a page shows and a button does exactly what the API would.

A person logs in by pasting an API key; it is kept in a cookie that JavaScript cannot read
(HttpOnly), that no other site's request carries (SameSite=Strict), and that travels only over
TLS when the dashboard is served over https (Secure). Every button is a form POST that carries
a CSRF token derived from the key (an HMAC the server recomputes), and a POST whose ``Origin``
names another site is refused as well. The key's scopes apply as on the API: a read key sees
everything it may read and the buttons answer ``403 forbidden``.
"""

import hashlib
import hmac
import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlencode, urlsplit

from fastapi import APIRouter, Depends, FastAPI, Form, Header, Query, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.concurrency import run_in_threadpool

from api.deps import CeleryDep, RuntimeDep, SessionDep, SettingsDep, UiVia
from api.errors import ApiError, status_for
from api.routes import approvals, events, jobs, runs
from api.schemas import DecisionCreate, JobPublic, RerunCreate
from api.throttle import check_rate
from api.uigraph import dag, timeline
from service.catalogue.diffs import DiffKind
from service.engine.checkpoints import step_outputs
from service.engine.events import step_history
from service.engine.jobs import get_job, step_task_ids
from service.engine.steplogs import step_lines, tail_lines
from service.language.dag import topological_layers
from service.language.snapshots import job_profile
from service.platform.auth import KeyCache, Principal
from service.platform.clock import utcnow
from service.platform.errors import CsrfInvalid, FlowbeatError, Forbidden, Unauthorized
from service.platform.states import JOB_FINAL

HERE = Path(__file__).parent
COOKIE = "flowbeat_key"
COOKIE_MAX_AGE_S = 8 * 3600
CSRF_CONTEXT = b"flowbeat-ui-csrf"
PAGE_SIZE = 50
LOG_TAIL_LINES = 50
TIMELINE_EVENTS = 5000
"""Lines of each step's log on the job page; its full log is a page of its own."""
LOG_PAGE_LINES = 500
HOME = "/ui/home"
JOB_STATUSES = ("queued", "running", "awaiting_approval", "succeeded", "failed", "cancelled")

router = APIRouter(prefix="/ui", include_in_schema=False)
templates = Jinja2Templates(directory=HERE / "templates")


class LoginRequired(Exception):
    """No cookie, or one whose key no longer authenticates: back to the login page."""


def csrf_token(key: str) -> str:
    return hmac.new(key.encode(), CSRF_CONTEXT, hashlib.sha256).hexdigest()


async def _principal(request: Request, session: SessionDep) -> Principal:
    token = request.cookies.get(COOKIE)
    if not token:
        raise LoginRequired
    keys: KeyCache = request.app.state.keys
    principal = keys.cached(token)
    if principal is None:
        try:
            principal = await run_in_threadpool(keys.authenticate, session, token)
        except Unauthorized:
            raise LoginRequired from None
    principal.require("read")
    await check_rate(request.app, principal)
    return principal


Viewer = Annotated[Principal, Depends(_principal)]


def _same_site(request: Request, origin: str | None) -> None:
    if origin is not None and urlsplit(origin).netloc != request.url.netloc:
        raise CsrfInvalid("cross-site request refused", {"origin": origin})


async def _checked_post(
    request: Request,
    viewer: Viewer,
    csrf: Annotated[str, Form()] = "",
    origin: Annotated[str | None, Header()] = None,
) -> Principal:
    """The cookie's principal, for a form POST with the token of its key from a page of ours."""
    _same_site(request, origin)
    expected = csrf_token(request.cookies.get(COOKIE, ""))
    if not hmac.compare_digest(csrf.encode(), expected.encode()):
        raise CsrfInvalid("missing or invalid CSRF token", {"field": "csrf"})
    return viewer


Poster = Annotated[Principal, Depends(_checked_post)]


async def _writer(poster: Poster) -> Principal:
    """The route functions the buttons call check no scope themselves (the API's dependencies
    do), so a button checks the one its route would."""
    poster.require("write")
    return poster


Actor = Annotated[Principal, Depends(_writer)]


def _page(request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    settings = request.app.state.settings
    return templates.TemplateResponse(
        request,
        name,
        {
            "csrf": csrf_token(request.cookies.get(COOKIE, "")),
            "flower_url": (settings.flower_url or "").rstrip("/"),
            **context,
        },
        status_code=status_code,
    )


page = _page
"""For the dashboard's pages in modules of their own (``api.ui_audit``, ``api.ui_catalogue``,
``api.ui_inbox``)."""


def _back(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303)


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, next: str = HOME) -> Response:
    return _page(request, "login.html", next=_local(next))


def _local(url: str) -> str:
    """Only a path of this dashboard, so a login link cannot send a person elsewhere."""
    return url if url.startswith("/ui/") and "//" not in url else HOME


@router.post("/login")
async def login(
    request: Request,
    session: SessionDep,
    key: Annotated[str, Form()] = "",
    next: Annotated[str, Form()] = HOME,
    origin: Annotated[str | None, Header()] = None,
) -> Response:
    """Another site's page could log a person in under the attacker's key (login CSRF), so
    the login form is refused from another origin like the buttons are."""
    _same_site(request, origin)
    keys: KeyCache = request.app.state.keys
    try:
        principal = await run_in_threadpool(keys.authenticate, session, key.strip())
        principal.require("read")
    except FlowbeatError as exc:
        return _page(request, "login.html", 401, next=_local(next), error=exc.message)
    response = _back(_local(next))
    response.set_cookie(
        COOKIE,
        key.strip(),
        max_age=COOKIE_MAX_AGE_S,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/ui",
    )
    return response


@router.post("/logout")
def logout(_: Poster) -> Response:
    response = _back("/ui/login")
    response.delete_cookie(COOKIE, path="/ui")
    return response


@router.get("", include_in_schema=False)
def home() -> Response:
    return _back(HOME)


def moment(name: str, value: str) -> datetime | None:
    """A bound of the list's window, ISO 8601 with a zone, as the home page's links give it."""
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        message = f"{name}: not an ISO 8601 time: {value!r}"
        raise ApiError("invalid_query", message, {"param": name}) from None
    if parsed.tzinfo is None:
        raise ApiError("invalid_query", f"{name}: give a time zone", {"param": name})
    return parsed


@dataclass(frozen=True)
class ListFilter:
    """The job list's filter as the dashboard's pages carry it in their links and forms:
    ``labels`` are ``key:value`` pairs apart by spaces, each of which a job must have;
    ``since`` (included) and ``until`` (excluded) bound when a job was submitted."""

    status: str = ""
    pipeline: str = ""
    labels: str = ""
    error_code: str = ""
    since: str = ""
    until: str = ""

    def given(self) -> dict[str, str]:
        return {name: value for name, value in asdict(self).items() if value}


@router.get("/jobs", response_class=HTMLResponse)
def job_list(
    request: Request,
    viewer: Viewer,
    session: SessionDep,
    shown: Annotated[ListFilter, Depends()],
    cursor: str = "",
    parent: uuid.UUID | None = None,
) -> Response:
    found = jobs.search_jobs(
        viewer,
        session,
        pipeline=shown.pipeline or None,
        status=[shown.status] if shown.status else None,
        label=shown.labels.split() or None,
        error_code=shown.error_code or None,
        since=moment("since", shown.since),
        until=moment("until", shown.until),
        limit=PAGE_SIZE,
        cursor=cursor or None,
        parent=parent,
    )
    query = urlencode(shown.given())
    if parent is not None:
        query += f"&parent={parent}"
    return _page(
        request,
        "jobs.html",
        jobs=found.jobs,
        next_cursor=found.next_cursor,
        parent=parent,
        statuses=JOB_STATUSES,
        query=query,
        filtered=bool(shown.given()) and parent is None,
        **asdict(shown),
    )


def _job_context(viewer: Principal, session: SessionDep, job_id: str) -> dict[str, Any]:
    public = jobs.read_job(job_id, viewer, session).job
    row = get_job(session, public.id, owner=jobs.visible_to(viewer))
    profile = job_profile(row)
    layers = topological_layers({s.id: list(s.depends_on) for s in profile.steps})
    steps = {s.step_id: s for s in public.steps}
    outputs = step_outputs(session, public.id, set(steps))
    return {
        "job": public,
        "layers": [[steps[step_id] for step_id in layer if step_id in steps] for layer in layers],
        "actions": {s.id: s.action for s in profile.steps},
        "outputs": {k: json.dumps(v, indent=2, default=str)[:4000] for k, v in outputs.items()},
        "task_ids": step_task_ids(session, public.id),
        "logs": tail_lines(session, public.id, LOG_TAIL_LINES),
        "final": public.status in JOB_FINAL,
        "graph": dag(profile, {step_id: step.status for step_id, step in steps.items()}),
        "timeline": timeline(
            profile,
            step_history(session, public.id, TIMELINE_EVENTS),
            public.created_at,
            public.finished_at or utcnow(),
        ),
    }


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(request: Request, job_id: str, viewer: Viewer, session: SessionDep) -> Response:
    return _page(request, "job.html", **_job_context(viewer, session, job_id))


@router.get("/jobs/{job_id}/panel", response_class=HTMLResponse)
def job_panel(request: Request, job_id: str, viewer: Viewer, session: SessionDep) -> Response:
    """The part of the job page that live updates replace."""
    return _page(request, "job_panel.html", **_job_context(viewer, session, job_id))


@router.get("/jobs/{job_id}/steps/{step_id}/logs", response_class=HTMLResponse)
def step_log_page(
    request: Request,
    job_id: str,
    step_id: str,
    viewer: Viewer,
    session: SessionDep,
    attempt: Annotated[int | None, Query(ge=1)] = None,
    after: Annotated[int, Query(ge=0)] = 0,
) -> Response:
    """A step's whole log, a page at a time, as ``GET /v1/jobs/{id}/steps/{step_id}/logs``."""
    key = jobs.parse_job_id(job_id)
    lines = step_lines(
        session,
        key,
        step_id,
        owner=jobs.visible_to(viewer),
        attempt=attempt,
        after=after,
        limit=LOG_PAGE_LINES,
    )
    return _page(
        request,
        "step_logs.html",
        job_id=key,
        step_id=step_id,
        attempt=attempt,
        lines=lines,
        next_after=lines[-1].id if len(lines) == LOG_PAGE_LINES else None,
    )


@router.get("/jobs/{job_id}/events")
async def job_events(
    request: Request,
    job_id: str,
    viewer: Viewer,
    session: SessionDep,
    runtime: RuntimeDep,
    settings: SettingsDep,
    last_event_id: Annotated[str | None, Header()] = None,
) -> Response:
    """The job's event stream for the page's EventSource, which cannot send a bearer key: the
    same stream as ``/v1/jobs/{id}/events``, authenticated by the cookie (a GET changes
    nothing, so it needs no CSRF token)."""
    return await events.stream_job_events(
        request,
        job_id,
        viewer,
        session,
        runtime,
        settings,
        after=None,
        accept="text/event-stream",
        last_event_id=last_event_id,
    )


@router.post("/jobs/{job_id}/cancel")
def cancel(
    job_id: str,
    actor: Actor,
    session: SessionDep,
    runtime: RuntimeDep,
    celery_app: CeleryDep,
    via: UiVia,
) -> Response:
    jobs.cancel(job_id, actor, session, runtime, celery_app, via)
    return _back(f"/ui/jobs/{job_id}")


@router.post("/jobs/{job_id}/rerun")
def rerun(
    job_id: str,
    actor: Actor,
    session: SessionDep,
    runtime: RuntimeDep,
    celery_app: CeleryDep,
    settings: SettingsDep,
    via: UiVia,
    from_step: Annotated[str, Form()],
) -> Response:
    body = RerunCreate(from_step=from_step)
    created = jobs.rerun(job_id, body, actor, session, runtime, celery_app, settings, via)
    return _back(f"/ui/jobs/{created.job.id}")


@router.post("/jobs/{job_id}/steps/{step_id}/{decision}")
def decide(
    job_id: str,
    step_id: str,
    decision: str,
    actor: Actor,
    session: SessionDep,
    runtime: RuntimeDep,
    celery_app: CeleryDep,
    via: UiVia,
    comment: Annotated[str, Form()] = "",
    back: Annotated[str, Form()] = "",
) -> Response:
    """Back to the job, or to the page the button was on (the approvals inbox)."""
    body = DecisionCreate(comment=comment or None)
    decide_with = {"approve": approvals.approve, "reject": approvals.reject}.get(decision)
    if decide_with is None:
        raise Forbidden(f"no decision {decision!r}", {"decision": decision})
    decide_with(job_id, step_id, body, actor, session, runtime, celery_app, via)
    return _back(_local(back) if back else f"/ui/jobs/{job_id}")


@router.get("/jobs/{job_id}/diff", response_class=HTMLResponse)
def diff_page(
    request: Request,
    job_id: str,
    viewer: Viewer,
    session: SessionDep,
    kind: DiffKind = DiffKind.NEW,
    cursor: Annotated[str, Query(max_length=1024)] = "",
) -> Response:
    diff = runs.job_diff(job_id, viewer, session, kind=kind, limit=PAGE_SIZE, cursor=cursor or None)
    items = [json.dumps(item, default=str) for item in diff.items]
    return _page(request, "diff.html", diff=diff, items=items, kinds=list(DiffKind))


async def _to_login(request: Request, _: Exception) -> Response:
    target = quote(request.url.path + (f"?{request.url.query}" if request.url.query else ""))
    return _back(f"/ui/login?next={target}")


def _error_page(
    handler: Callable[[Request, Any], Response | Awaitable[Response]],
) -> Callable[[Request, Exception], Awaitable[Response]]:
    """Refusals on dashboard pages as a page, elsewhere as the API's envelope."""

    async def render(request: Request, exc: Exception) -> Response:
        if request.url.path.startswith("/ui") and isinstance(exc, FlowbeatError):
            status = status_for(exc.code)
            return _page(request, "error.html", status, code=exc.code, message=exc.message)
        answer = handler(request, exc)
        return await answer if isinstance(answer, Awaitable) else answer

    return render


def install_ui(app: FastAPI) -> None:
    app.include_router(router)
    app.mount("/ui/static", StaticFiles(directory=HERE / "static"), name="ui-static")
    app.add_exception_handler(LoginRequired, _to_login)
    handler = app.exception_handlers[FlowbeatError]
    app.add_exception_handler(FlowbeatError, _error_page(handler))


def when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S") if moment else ""


def clock(moment: datetime) -> str:
    """A log line's time of day to the millisecond, in UTC as every time on the dashboard."""
    return moment.strftime("%H:%M:%S.%f")[:-3]


def duration(job: JobPublic) -> str:
    if job.started_at and job.finished_at:
        return f"{(job.finished_at - job.started_at).total_seconds():.1f}s"
    return ""


templates.env.filters["when"] = when
templates.env.filters["clock"] = clock
templates.env.globals["duration"] = duration
