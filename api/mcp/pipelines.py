"""The MCP tools and resources about pipelines: save, list, load, delete, their history, and
their schedules."""

import json
from collections.abc import Callable
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from sqlalchemy.orm import Session

from api.mcp.calls import McpDeps, acting, admin, as_yaml, call, public, visible_to
from api.routes.runs import RunPublic
from api.routes.schedules import SchedulePublic
from service.catalogue.diffs import DiffKind, diff_page
from service.catalogue.imports import fetch_url, import_policy, read_import_file
from service.catalogue.pipelines import get_pipeline, list_pipelines
from service.catalogue.saving import delete_pipeline
from service.catalogue.saving import save_pipeline as save
from service.engine.filters import JobFilter
from service.engine.jobs import list_jobs
from service.engine.submission import resolve_request
from service.language.cron import ScheduleSpec
from service.language.loading import load_profile_text
from service.language.yamlsafe import load_yaml
from service.platform.audit import Target, record, saved_event, schedule_event, schedule_saved
from service.platform.auth import Principal
from service.platform.clock import utcnow
from service.platform.constants import JOB_LIST_MAX_LIMIT, MCP_HISTORY_NEW_ITEMS
from service.platform.states import JobStatus
from service.triggers.schedules import (
    delete_schedule,
    list_schedules,
    put_schedule,
    set_schedule,
    summarize,
)


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
            admin=admin(principal),
        )
        return {"source": "saved", "pipeline": public(view), "yaml": as_yaml(view)}
    profile = load_profile_text(text, source=source, known_actions=deps.runtime.registry.names())
    return {"source": kind, "name": profile.name, "yaml": text}


def _history(session: Session, principal: Principal, name: str, limit: int) -> dict[str, Any]:
    jobs, _ = list_jobs(
        session, owner=visible_to(principal), match=JobFilter(pipeline=name), limit=limit
    )
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
    actor = acting(principal, "schedule_pipeline")
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


def pipeline_tools(server: MCPServer, deps: McpDeps) -> None:
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
                record(session, acting(principal, "save_pipeline"), "pipeline.save", *event)
            session.commit()
            return {"pipeline": public(view), "created_version": outcome.created_version}

        return await call(deps, ctx, "write", work)

    @server.tool(name="list_pipelines")
    async def list_pipelines_tool(ctx: Context, tag: str = "") -> dict[str, Any]:
        """The pipelines this key can run: its own, those shared with it, the shipped ones."""

        def work(session: Session, principal: Principal) -> dict[str, Any]:
            views = list_pipelines(
                session,
                viewer=principal.owner,
                profiles_dir=settings.profiles_dir,
                tag=tag or None,
                admin=admin(principal),
            )
            return {"pipelines": [public(view) for view in views]}

        return await call(deps, ctx, "read", work)

    @server.tool()
    async def load_pipeline(source: str, ctx: Context) -> dict[str, Any]:
        """A pipeline's YAML for review: a saved name (``name`` or ``saved:name``), an
        allow-listed ``https://`` or ``url:https://`` address, or ``file:path`` in the import
        directory. Fetched profiles are validated, not saved."""
        return await call(
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
                admin=admin(principal),
                purge_history=purge_history,
            )
            actor, target = acting(principal, "delete_pipeline"), Target("pipeline", name)
            detail = {"owner": principal.owner, "purged_jobs": purged}
            record(session, actor, "pipeline.delete", target, detail)
            session.commit()
            return {"name": name, "purged_jobs": purged}

        return await call(deps, ctx, "write", work)

    @server.tool()
    async def get_pipeline_history(name: str, ctx: Context, limit: int = 5) -> dict[str, Any]:
        """The newest runs with item counts against the run before each, and the newest
        successful run's first new items."""
        limit = max(1, min(limit, JOB_LIST_MAX_LIMIT))
        return await call(
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
        return await call(
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

        return await call(deps, ctx, "read", work)


def resources(server: MCPServer, deps: McpDeps) -> None:
    async def read(ctx: Context, work: Callable[[Session, Principal], str]) -> str:
        try:
            return await call(deps, ctx, "read", work)
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
                admin=admin(principal),
            )
            return as_yaml(view)

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
