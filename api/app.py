"""The FastAPI application: routes, error envelope and body cap around a Runtime and Celery app."""

import gc
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import Depends, FastAPI

from api import ui_audit, ui_bulk, ui_catalogue, ui_home, ui_inbox
from api.deps import text_parameters
from api.docs import install_docs
from api.errors import install_error_handlers
from api.lane import SubmitLane
from api.limits import BodySizeLimit
from api.mcp import McpDeps
from api.openapi import install_openapi
from api.routes import (
    actions,
    alerts,
    approvals,
    audit,
    backfills,
    bulk,
    events,
    health,
    hooks,
    jobs,
    metrics,
    overview,
    pipelines,
    queues,
    ratelimits,
    runs,
    schedules,
    signals,
    steplogs,
)
from api.routes.mcp import install_mcp, mcp_sessions
from api.streams import stop_listener
from api.submit import loop_io
from api.telemetry import RequestMetrics
from api.throttle import throttle
from api.ui import install_ui
from service.engine.runtime import Runtime
from service.platform import logs, tracing
from service.platform.auth import KeyCache
from service.platform.constants import VERSION
from service.platform.settings import Settings, get_settings

if TYPE_CHECKING:
    from celery import Celery


ROUTES = (
    health,
    bulk,
    jobs,
    events,
    steplogs,
    approvals,
    signals,
    runs,
    pipelines,
    schedules,
    backfills,
    hooks,
    alerts,
    metrics,
    queues,
    ratelimits,
    overview,
    audit,
    actions,
)
"""The route modules, in the order their routes are matched."""


def create_app(
    settings: Settings, *, runtime: Runtime | None = None, celery_app: "Celery | None" = None
) -> FastAPI:
    """Build the app. A Runtime or Celery app passed in is used as is (tests share them);
    the defaults are built from ``settings`` and the process-wide ``tasks.app.app``."""
    owns_engine = runtime is None
    if runtime is None:
        runtime = Runtime.start(settings, pool_size=settings.api_db_pool_size)
    if celery_app is None:
        from tasks.app import app as default_celery

        celery_app = default_celery
    built = runtime

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        io_of_loop = loop_io(settings, built, celery_app)
        async with mcp_sessions(app), io_of_loop as io, throttle(settings) as limits:
            app.state.loop_io = io
            app.state.throttle = limits
            yield
            app.state.loop_io = None
            app.state.throttle = None
        stop_listener(app)
        if owns_engine:
            bind = built.sessions.kw.get("bind")
            if bind is not None:
                bind.dispose()

    app = FastAPI(
        title="flowbeat",
        version=VERSION,
        lifespan=lifespan,
        dependencies=[Depends(text_parameters)],
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.runtime = runtime
    app.state.celery_app = celery_app
    app.state.loop_io = None
    app.state.started_at = time.monotonic()
    app.state.keys = KeyCache(settings.auth_cache_s)
    app.state.throttle = None
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(SubmitLane, api=app, max_bytes=settings.max_body_bytes)
    app.add_middleware(RequestMetrics)
    for routes in ROUTES:
        app.include_router(routes.router)
    install_mcp(app, McpDeps(settings, runtime, celery_app, app.state.keys))
    metrics.install_metrics(app, runtime)
    install_ui(app)
    app.include_router(ui_audit.router)
    app.include_router(ui_bulk.router)
    app.include_router(ui_catalogue.router)
    app.include_router(ui_inbox.router)
    app.include_router(ui_home.router)
    install_openapi(app)
    install_docs(app)
    return app


def app_from_env() -> FastAPI:
    """ASGI factory: ``uvicorn --factory api.app:app_from_env``.

    What the process holds once built (its modules, FastAPI's routes, pydantic's and
    SQLAlchemy's schemas: some 210,000 objects) goes into the collector's permanent generation.
    Left in the oldest one, each full collection walked all of it, about 0.1 s with the GIL
    held, and every request in flight waited for it: the tail of the enqueue latency."""
    settings = get_settings()
    logs.configure(settings.log_format, settings.log_level, background=True)
    app = create_app(settings)
    if tracing.configure("flowbeat-api"):
        from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

        app.add_middleware(OpenTelemetryMiddleware)
    gc.collect()
    gc.freeze()
    return app
