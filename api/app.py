"""The FastAPI application: routes, error envelope and body cap around a Runtime and Celery app."""

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import FastAPI

from api.errors import install_error_handlers
from api.limits import BodySizeLimit
from api.routes import health, jobs, metrics, pipelines, runs, schedules
from service.auth import KeyCache
from service.constants import VERSION
from service.runtime import Runtime
from service.settings import Settings, get_settings

if TYPE_CHECKING:
    from celery import Celery


def create_app(
    settings: Settings, *, runtime: Runtime | None = None, celery_app: "Celery | None" = None
) -> FastAPI:
    """Build the app. A Runtime or Celery app passed in is used as is (tests share them);
    the defaults are built from ``settings`` and the process-wide ``tasks.app.app``."""
    owns_engine = runtime is None
    if runtime is None:
        runtime = Runtime.start(settings)
    if celery_app is None:
        from tasks.app import app as default_celery

        celery_app = default_celery
    built = runtime

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        if owns_engine:
            bind = built.sessions.kw.get("bind")
            if bind is not None:
                bind.dispose()

    app = FastAPI(title="flowbeat", version=VERSION, lifespan=lifespan)
    app.state.settings = settings
    app.state.runtime = runtime
    app.state.celery_app = celery_app
    app.state.started_at = time.monotonic()
    app.state.keys = KeyCache(settings.auth_cache_s)
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    app.include_router(health.router)
    app.include_router(jobs.router)
    app.include_router(runs.router)
    app.include_router(pipelines.router)
    app.include_router(schedules.router)
    app.include_router(metrics.router)
    metrics.install_metrics(app, runtime)
    return app


def app_from_env() -> FastAPI:
    """ASGI factory: ``uvicorn --factory api.app:app_from_env``."""
    return create_app(get_settings())
