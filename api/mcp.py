"""The MCP tools of seed 000 (§4, §11): what an agent uses to save, run and schedule pipelines.

Each tool is a thin entry point like a route: it authenticates the caller's key, checks its
scope, calls ``service/`` in its own session and commits. Answers are the REST API's own
response models, so an agent and a script read the same shapes. A refusal is a tool error
whose text starts with the error code the REST API would answer with.

Over HTTP the bearer key of each request is the caller (the route checked it and its rate
before the SDK saw the request); over stdio, ``flowbeat mcp`` holds one key for the process.
"""

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import yaml
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from sqlalchemy.orm import Session

from api.routes.pipelines import PipelinePublic
from api.routes.runs import DiffCountsPublic, DiffPublic, RunPublic
from api.routes.schedules import SchedulePublic
from api.schemas import JobCreate, JobPublic, LogPage, SignalEnvelope, SignalPublic
from api.submit import accept_job
from service.catalogue.diffs import DiffKind, diff_counts, diff_page
from service.catalogue.imports import fetch_url, import_policy, read_import_file
from service.catalogue.pipelines import PipelineView, get_pipeline, list_pipelines
from service.catalogue.saving import delete_pipeline
from service.catalogue.saving import save_pipeline as save
from service.engine.jobs import get_job, job_view, list_jobs
from service.engine.runtime import Runtime
from service.engine.signals import send_signal
from service.engine.steplogs import step_lines
from service.engine.submission import resolve_request
from service.language.cron import ScheduleSpec
from service.language.loading import load_profile_text
from service.language.yamlsafe import load_yaml
from service.platform.audit import (
    Actor,
    Target,
    record,
    record_signal,
    saved_event,
    schedule_event,
    schedule_saved,
)
from service.platform.auth import KeyCache, Principal
from service.platform.clock import utcnow
from service.platform.constants import (
    DIFF_PAGE_MAX_LIMIT,
    JOB_LIST_MAX_LIMIT,
    MCP_HISTORY_NEW_ITEMS,
    STEP_LOG_PAGE_MAX_ROWS,
)
from service.platform.errors import FlowbeatError, JobNotFound, Unauthorized
from service.platform.settings import Settings
from service.platform.states import JobStatus
from service.triggers.schedules import (
    delete_schedule,
    list_schedules,
    put_schedule,
    set_schedule,
    summarize,
)
from tasks.dispatch import publish_or_defer

if TYPE_CHECKING:
    from celery import Celery

T = TypeVar("T")

INSTRUCTIONS = (
    "flowbeat runs YAML pipelines on workers. save_pipeline stores one (a new version when it "
    "changes), run_pipeline starts a job, get_job follows it, get_diff shows what a run found "
    "that the run before it did not, schedule_pipeline runs it on a cron (several schedules per "
    "pipeline by name), list_schedules shows them, send_signal resumes a step that waits for a "
    "signal."
)


@dataclass(frozen=True)
class McpDeps:
    settings: Settings
    runtime: Runtime
    celery_app: "Celery"
    keys: KeyCache
    token: str | None = None
    """The one key of a stdio server; over HTTP each request brings its own."""


def _token(deps: McpDeps, ctx: Context) -> str:
    if deps.token is not None:
        return deps.token
    scheme, _, token = (ctx.headers or {}).get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ToolError(f"{Unauthorized.code}: missing or invalid API key")
    return token.strip()


async def _call(
    deps: McpDeps, ctx: Context, scope: str, work: Callable[[Session, Principal], T]
) -> T:
    """Run ``work`` in a worker thread with its own session, as the caller, within ``scope``."""
    token = _token(deps, ctx)

    def run() -> T:
        with deps.runtime.sessions() as session:
            try:
                principal = deps.keys.authenticate(session, token)
                principal.require(scope)
                return work(session, principal)
            except FlowbeatError as exc:
                raise ToolError(f"{exc.code}: {exc.message}") from None

    return await anyio.to_thread.run_sync(run)


def _actor(principal: Principal, tool: str) -> Actor:
    return Actor.of_key(principal, "mcp", f"mcp {tool}")


def _admin(principal: Principal) -> bool:
    return principal.has("admin")


def _visible_to(principal: Principal) -> str | None:
    return None if _admin(principal) else principal.owner


def _public(view: PipelineView) -> dict[str, Any]:
    return PipelinePublic.of(view).model_dump(mode="json")


def _as_yaml(view: PipelineView) -> str:
    """The text the version was saved from, as a person wrote it; re-serialised only when no
    text was kept."""
    if view.source is not None:
        return view.source
    return yaml.safe_dump(view.profile.to_json(), sort_keys=False, allow_unicode=True)


def _job_id(raw: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise JobNotFound(f"no job {raw}", {"job_id": raw}) from None


def _with_metadata(config: str, tags: str, description: str) -> str | dict[str, Any]:
    """The profile with the tool's tags and description set; the text as given when there are
    none, or when it is not a mapping (the loader then says what is wrong with it)."""
    if not tags and not description:
        return config
    document = load_yaml(config)
    if not isinstance(document, dict):
        return config
    if tags:
        document["tags"] = [tag.strip() for tag in tags.split(",") if tag.strip()]
    if description:
        document["description"] = description
    return document


def _load_source(deps: McpDeps, session: Session, principal: Principal, source: str) -> Any:
    """A saved pipeline by name (``saved:`` optional), or a profile fetched through the import
    guards (``url:``/``https://``, ``file:``), validated but not saved."""
    settings = deps.settings
    kind, _, rest = source.partition(":")
    if kind in ("url", "https"):
        url = rest if kind == "url" else source
        session.commit()
        text = fetch_url(url, import_policy(settings))
    elif kind == "file":
        text = read_import_file(rest, settings.import_dir, settings.import_max_bytes)
    else:
        name = rest if kind == "saved" else source
        view = get_pipeline(
            session,
            name,
            viewer=principal.owner,
            profiles_dir=settings.profiles_dir,
            admin=_admin(principal),
        )
        return {"source": "saved", "pipeline": _public(view), "yaml": _as_yaml(view)}
    profile = load_profile_text(text, source=source, known_actions=deps.runtime.registry.names())
    return {"source": kind, "name": profile.name, "yaml": text}


def _history(session: Session, principal: Principal, name: str, limit: int) -> dict[str, Any]:
    jobs, _ = list_jobs(session, owner=_visible_to(principal), pipeline=name, limit=limit)
    latest = next((job for job in jobs if job.status == JobStatus.SUCCEEDED), None)
    new_items: list[Any] = []
    if latest is not None and latest.item_count is not None:
        page = diff_page(session, latest, DiffKind.NEW, limit=MCP_HISTORY_NEW_ITEMS)
        new_items = page.items
    return {
        "pipeline": name,
        "runs": [RunPublic.of(job).model_dump(mode="json") for job in jobs],
        "latest_new_items": new_items,
    }


def _schedule(
    deps: McpDeps,
    session: Session,
    principal: Principal,
    name: str,
    schedule: str | None,
    spec: ScheduleSpec | None,
) -> dict[str, Any]:
    """``schedule`` None is the pipeline's only schedule, as on the one-schedule routes."""
    actor = _actor(principal, "schedule_pipeline")
    if spec is None:
        row = delete_schedule(session, owner=principal.owner, pipeline=name, schedule=schedule)
        record(session, actor, "schedule.delete", *schedule_event(row))
        session.commit()
        return {"pipeline": name, "schedule_id": str(row.id), "removed": True}
    profile = resolve_request(
        session,
        name,
        owner=principal.owner,
        profiles_dir=deps.settings.profiles_dir,
        known_actions=deps.runtime.registry.names(),
    ).profile
    now = utcnow()
    if schedule is None:
        row = put_schedule(
            session,
            owner=principal.owner,
            profile=profile,
            spec=spec,
            settings=deps.settings,
            now=now,
        )
    else:
        row, _ = set_schedule(
            session,
            owner=principal.owner,
            profile=profile,
            schedule=schedule,
            spec=spec,
            settings=deps.settings,
            now=now,
        )
    record(session, actor, schedule_saved(row, now), *schedule_event(row), at=now)
    public = SchedulePublic.of(summarize(session, [row])[0]).model_dump(mode="json")
    session.commit()
    return {"pipeline": name, "schedule": public}


def _diff(
    session: Session, principal: Principal, job_id: str, kind: DiffKind, limit: int
) -> dict[str, Any]:
    job = get_job(session, _job_id(job_id), owner=_visible_to(principal))
    page = diff_page(session, job, kind, limit=min(limit, DIFF_PAGE_MAX_LIMIT))
    return DiffPublic(
        job_id=job.id,
        previous_job_id=job.previous_job_id,
        kind=kind,
        counts=DiffCountsPublic(**diff_counts(session, job).as_dict()),
        items=page.items,
        next_cursor=page.next_cursor,
    ).model_dump(mode="json")


def build_mcp(deps: McpDeps) -> MCPServer:
    server: MCPServer = MCPServer("flowbeat", instructions=INSTRUCTIONS)
    _pipeline_tools(server, deps)
    _job_tools(server, deps)
    _resources(server, deps)
    return server


def _pipeline_tools(server: MCPServer, deps: McpDeps) -> None:
    settings = deps.settings

    @server.tool()
    async def save_pipeline(
        name: str, config: str, ctx: Context, tags: str = "", description: str = ""
    ) -> dict[str, Any]:
        """Save a pipeline (YAML or JSON) under ``name``; a changed profile becomes a new
        version, an unchanged one keeps its version. ``tags`` is comma-separated."""

        def work(session: Session, principal: Principal) -> dict[str, Any]:
            outcome = save(
                session,
                owner=principal.owner,
                name=name,
                body=_with_metadata(config, tags, description),
                settings=settings,
                known_actions=deps.runtime.registry.names(),
            )
            view = outcome.view
            if outcome.created_version:
                event = saved_event(view.name, view.owner, view.version)
                record(session, _actor(principal, "save_pipeline"), "pipeline.save", *event)
            session.commit()
            return {"pipeline": _public(view), "created_version": outcome.created_version}

        return await _call(deps, ctx, "write", work)

    @server.tool(name="list_pipelines")
    async def list_pipelines_tool(ctx: Context, tag: str = "") -> dict[str, Any]:
        """The pipelines this key can run: its own, those shared with it, the shipped ones."""

        def work(session: Session, principal: Principal) -> dict[str, Any]:
            views = list_pipelines(
                session,
                viewer=principal.owner,
                profiles_dir=settings.profiles_dir,
                tag=tag or None,
                admin=_admin(principal),
            )
            return {"pipelines": [_public(view) for view in views]}

        return await _call(deps, ctx, "read", work)

    @server.tool()
    async def load_pipeline(source: str, ctx: Context) -> dict[str, Any]:
        """A pipeline's YAML for review: a saved name (``name`` or ``saved:name``), an
        allow-listed ``https://`` or ``url:https://`` address, or ``file:path`` in the import
        directory. Fetched profiles are validated, not saved."""
        return await _call(
            deps, ctx, "read", lambda session, who: _load_source(deps, session, who, source)
        )

    @server.tool(name="delete_pipeline")
    async def delete_pipeline_tool(
        name: str, ctx: Context, purge_history: bool = False
    ) -> dict[str, Any]:
        """Delete a saved pipeline, its versions and its schedule; its runs too with
        ``purge_history`` (only this key owner's runs)."""

        def work(session: Session, principal: Principal) -> dict[str, Any]:
            purged = delete_pipeline(
                session,
                name,
                viewer=principal.owner,
                profiles_dir=settings.profiles_dir,
                admin=_admin(principal),
                purge_history=purge_history,
            )
            actor, target = _actor(principal, "delete_pipeline"), Target("pipeline", name)
            detail = {"owner": principal.owner, "purged_jobs": purged}
            record(session, actor, "pipeline.delete", target, detail)
            session.commit()
            return {"name": name, "purged_jobs": purged}

        return await _call(deps, ctx, "write", work)

    @server.tool()
    async def get_pipeline_history(name: str, ctx: Context, limit: int = 5) -> dict[str, Any]:
        """The newest runs with item counts against the run before each, and the newest
        successful run's first new items."""
        limit = max(1, min(limit, JOB_LIST_MAX_LIMIT))
        return await _call(
            deps, ctx, "read", lambda session, who: _history(session, who, name, limit)
        )

    @server.tool()
    async def schedule_pipeline(
        name: str,
        ctx: Context,
        cron: str = "",
        timezone: str = "UTC",
        diff_mode: bool = True,
        notify_url: str = "",
        schedule: str = "",
        params: dict[str, Any] | None = None,
        priority: int | None = None,
    ) -> dict[str, Any]:
        """Run a saved pipeline on a 5-field cron (in ``timezone``); an empty cron removes
        the schedule. A pipeline may have several schedules (a daily and a monthly run):
        ``schedule`` picks one by name or id, and a new name adds one; without it the
        pipeline's only schedule is meant. ``params`` and ``priority`` (0-9, default: the
        profile's) are what its runs start with. ``notify_url`` receives a signed POST when
        a run finds new items."""
        spec = (
            ScheduleSpec(
                cron=cron,
                timezone=timezone,
                params=params or {},
                priority=priority,
                diff_mode=diff_mode,
                notify_url=notify_url or None,
            )
            if cron.strip()
            else None
        )
        chosen = schedule.strip() or None
        return await _call(
            deps,
            ctx,
            "write",
            lambda session, who: _schedule(deps, session, who, name, chosen, spec),
        )

    @server.tool(name="list_schedules")
    async def list_schedules_tool(ctx: Context, pipeline: str = "") -> dict[str, Any]:
        """The caller's schedules (of ``pipeline`` only, when given) with their ids, names,
        params, priority, next and last fire and the last run's status."""

        def work(session: Session, principal: Principal) -> dict[str, Any]:
            summaries = list_schedules(
                session, owner=principal.owner, pipeline=pipeline.strip() or None
            )
            return {
                "schedules": [
                    SchedulePublic.of(summary).model_dump(mode="json") for summary in summaries
                ]
            }

        return await _call(deps, ctx, "read", work)


def _job_tools(server: MCPServer, deps: McpDeps) -> None:
    @server.tool()
    async def run_pipeline(
        pipeline: str,
        ctx: Context,
        params: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        diff_mode: bool = False,
        priority: int | None = None,
    ) -> dict[str, Any]:
        """Start a job of a saved pipeline (name or owner/name) or of inline YAML; the same
        ``idempotency_key`` twice gives back the first job. ``priority`` 0-9, higher is taken
        first within a queue (default: the profile's)."""
        body = JobCreate(
            pipeline=pipeline,
            params=params or {},
            idempotency_key=idempotency_key,
            diff_mode=diff_mode,
            priority=priority,
        )

        def work(session: Session, principal: Principal) -> dict[str, Any]:
            actor = _actor(principal, "run_pipeline")
            job, _ = accept_job(
                body, principal, session, deps.runtime, deps.settings, deps.celery_app, actor
            )
            return {"job": job.model_dump(mode="json")}

        return await _call(deps, ctx, "write", work)

    @server.tool(name="get_job")
    async def get_job_tool(job_id: str, ctx: Context) -> dict[str, Any]:
        """A job with each step's status, attempts, error and output, and its result."""

        def work(session: Session, principal: Principal) -> dict[str, Any]:
            job = get_job(session, _job_id(job_id), owner=_visible_to(principal))
            return {"job": JobPublic.of(job_view(session, job)).model_dump(mode="json")}

        return await _call(deps, ctx, "read", work)

    @server.tool(name="send_signal")
    async def send_signal_tool(
        job_id: str, name: str, ctx: Context, payload: Any = None
    ) -> dict[str, Any]:
        """Send a running job the signal ``name`` with a JSON ``payload``: the steps waiting
        for it (``wait_for``) run and read it as ``signals.<name>.payload``; one that waits
        later finds it. Once per name."""

        def work(session: Session, principal: Principal) -> dict[str, Any]:
            sent = send_signal(
                session,
                _job_id(job_id),
                name,
                payload,
                by=principal.owner,
                visible_to=_visible_to(principal),
                now=utcnow(),
            )
            record_signal(session, _actor(principal, "send_signal"), sent.job.id, name)
            session.commit()
            envelope = SignalEnvelope(
                signal=SignalPublic.of(sent.signal, sent.resumed),
                job=JobPublic.of(job_view(session, sent.job)),
            )
            session.commit()
            publish_or_defer(deps.celery_app, deps.runtime, sent.ready)
            return envelope.model_dump(mode="json")

        return await _call(deps, ctx, "write", work)

    @server.tool()
    async def get_diff(
        job_id: str, ctx: Context, kind: DiffKind = DiffKind.NEW, limit: int = 50
    ) -> dict[str, Any]:
        """What a run found against the previous successful run: counts of new, removed and
        unchanged items, and the first ``limit`` items of ``kind``."""
        limit = max(1, limit)
        return await _call(
            deps, ctx, "read", lambda session, who: _diff(session, who, job_id, kind, limit)
        )

    @server.tool()
    async def get_logs(
        job_id: str, step_id: str, ctx: Context, attempt: int = 0, after: int = 0, limit: int = 200
    ) -> dict[str, Any]:
        """What a step's attempts logged and printed, oldest first (``attempt`` 0: every
        attempt); pass ``next_after`` back as ``after`` for the lines that follow."""
        limit = min(max(1, limit), STEP_LOG_PAGE_MAX_ROWS)

        def work(session: Session, principal: Principal) -> dict[str, Any]:
            lines = step_lines(
                session,
                _job_id(job_id),
                step_id,
                owner=_visible_to(principal),
                attempt=attempt or None,
                after=after,
                limit=limit,
            )
            return LogPage.of(lines, after, limit).model_dump(mode="json")

        return await _call(deps, ctx, "read", work)


def _resources(server: MCPServer, deps: McpDeps) -> None:
    async def read(ctx: Context, work: Callable[[Session, Principal], str]) -> str:
        try:
            return await _call(deps, ctx, "read", work)
        except ToolError as exc:
            raise ResourceError(str(exc)) from None

    @server.resource("pipeline://saved/{name}", mime_type="application/yaml")
    async def saved_pipeline(name: str, ctx: Context) -> str:
        """A saved or shipped pipeline's current profile, as YAML."""

        def work(session: Session, principal: Principal) -> str:
            view = get_pipeline(
                session,
                name,
                viewer=principal.owner,
                profiles_dir=deps.settings.profiles_dir,
                admin=_admin(principal),
            )
            return _as_yaml(view)

        return await read(ctx, work)

    @server.resource("pipeline://history/{name}/latest", mime_type="application/json")
    async def latest_run(name: str, ctx: Context) -> str:
        """The pipeline's newest run and its first new items, as JSON."""

        def work(session: Session, principal: Principal) -> str:
            history = _history(session, principal, name, 1)
            latest = history["runs"][0] if history["runs"] else None
            new_items = history["latest_new_items"]
            return json.dumps({"pipeline": name, "run": latest, "new_items": new_items})

        return await read(ctx, work)
