"""Liveness with dependency checks: 200 only when PostgreSQL and the broker both answer."""

import time
from collections.abc import Callable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from api.deps import broker_probe
from api.schemas import Check, Health
from service.engine.runtime import Runtime
from service.platform.constants import VERSION
from service.platform.db import ping
from service.platform.settings import Settings

router = APIRouter(tags=["health"])


def _timed(probe: Callable[[], object]) -> Check:
    start = time.perf_counter()
    try:
        probe()
    except Exception as exc:
        elapsed = (time.perf_counter() - start) * 1000
        return Check(ok=False, latency_ms=round(elapsed, 2), error=f"{type(exc).__name__}: {exc}")
    return Check(ok=True, latency_ms=round((time.perf_counter() - start) * 1000, 2))


def _broker(settings: Settings) -> None:
    with broker_probe(settings) as client:
        client.ping()


@router.get("/health", response_model=Health, responses={503: {"model": Health}})
def health(request: Request) -> JSONResponse:
    runtime: Runtime = request.app.state.runtime
    settings: Settings = request.app.state.settings
    checks = {
        "database": _timed(lambda: ping(runtime.sessions)),
        "broker": _timed(lambda: _broker(settings)),
    }
    ok = all(check.ok for check in checks.values())
    body = Health(
        status="ok" if ok else "degraded",
        version=VERSION,
        uptime_s=round(time.monotonic() - request.app.state.started_at, 3),
        checks=checks,
    )
    return JSONResponse(
        body.model_dump(mode="json", exclude_none=True), status_code=200 if ok else 503
    )
