"""The dashboard's catalogue pages: the pipelines (each with its YAML as saved, its versions,
its runs drawn as bars and its schedules), every schedule, the deployment's queues and rate
limits, and the actions its steps may name."""

import json
from typing import Any

import yaml
from fastapi import APIRouter, Request, Response
from fastapi.responses import HTMLResponse

from api.deps import RuntimeDep, SessionDep, SettingsDep
from api.routes import backfills, pipelines, runs, schedules
from api.routes.actions import catalogue
from api.routes.queues import QueuePublic, read_queues
from api.routes.ratelimits import list_rate_limits
from api.ui import PAGE_SIZE, Viewer, page
from service.actions.signature import input_rows
from service.platform.clock import utcnow

router = APIRouter(prefix="/ui", include_in_schema=False)


@router.get("/pipelines", response_class=HTMLResponse)
def pipeline_list(
    request: Request, viewer: Viewer, session: SessionDep, settings: SettingsDep
) -> Response:
    found = pipelines.index(viewer, session, settings)
    return page(request, "pipelines.html", pipelines=found.pipelines)


@router.get("/pipelines/{name}", response_class=HTMLResponse)
def pipelinepage(
    request: Request,
    name: str,
    viewer: Viewer,
    session: SessionDep,
    settings: SettingsDep,
) -> Response:
    detail = pipelines.read(name, viewer, session, settings).pipeline
    versions = (
        pipelines.versions(name, viewer, session).versions if detail.version is not None else []
    )
    history = runs.pipeline_runs(name, viewer, session, limit=PAGE_SIZE).runs
    planned = schedules.pipeline_schedules(name, viewer, session).schedules
    filled = backfills.all_pipeline_backfills(name, viewer, session).backfills
    return page(
        request,
        "pipeline.html",
        pipeline=detail,
        yaml=detail.source
        if detail.source is not None
        else yaml.safe_dump(detail.profile, sort_keys=False, allow_unicode=True),
        versions=versions,
        runs=history,
        chart=run_chart(history),
        schedules=planned,
        backfills=filled,
    )


@router.get("/schedules", response_class=HTMLResponse)
def schedule_list(request: Request, viewer: Viewer, session: SessionDep) -> Response:
    found = schedules.all_schedules(viewer, session)
    return page(request, "schedules.html", schedules=found.schedules)


@router.get("/queues", response_class=HTMLResponse)
def queue_list(request: Request, viewer: Viewer) -> Response:
    """Every queue, as ``GET /v1/queues`` lists it: a deployment's, not an owner's."""
    now = utcnow()
    states = read_queues(request.app.state.settings)
    return page(request, "queues.html", queues=[QueuePublic.of(state, now) for state in states])


@router.get("/rate-limits", response_class=HTMLResponse)
def rate_limit_list(request: Request, viewer: Viewer, session: SessionDep) -> Response:
    """Every rate-limit key, as ``GET /v1/rate-limits`` lists it, with the viewer's steps
    waiting for each."""
    found = list_rate_limits(request, viewer, session)
    return page(request, "rate_limits.html", keys=found.keys)


@router.get("/actions", response_class=HTMLResponse)
def action_list(request: Request, viewer: Viewer, runtime: RuntimeDep) -> Response:
    """The catalogue of ``GET /v1/actions``: a deployment's, the same for every key."""
    found = catalogue(runtime.registry).actions
    return page(
        request,
        "actions.html",
        actions=found,
        inputs={action.name: input_rows(action.input_schema) for action in found},
        schemas={action.name: json.dumps(action.input_schema, indent=2) for action in found},
    )


CHART_W, CHART_H, BAR_GAP = 600, 120, 2


def run_chart(history: list[Any]) -> dict[str, Any]:
    """Bars of run durations, oldest left, coloured by status: an inline SVG's geometry."""
    done = [r for r in reversed(history) if r.started_at and r.finished_at]
    seconds = [max((r.finished_at - r.started_at).total_seconds(), 0.0) for r in done]
    top = max(seconds, default=0.0) or 1.0
    width = CHART_W / max(len(done), 1)
    bars = [
        {
            "x": round(i * width, 1),
            "w": round(max(width - BAR_GAP, 1), 1),
            "h": round(max(s / top * (CHART_H - 20), 1), 1),
            "status": r.status,
            "label": f"{r.job_id} {r.status} {s:.1f}s",
        }
        for i, (r, s) in enumerate(zip(done, seconds, strict=True))
    ]
    return {"bars": bars, "width": CHART_W, "height": CHART_H, "top_s": round(top, 1)}
