"""Request dependencies: a database session per request and bearer-key authentication.

They are coroutines that do no I/O in the common case, so a request pays one hop to the
thread pool (its sync route) instead of one per dependency. A key missing from the cache,
and the rollback of a session its route left open, go to the thread pool.
"""

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated

import redis
from celery import Celery
from fastapi import Depends, FastAPI, Request
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from api.errors import ApiError
from api.throttle import check_rate
from service.engine.runtime import Runtime
from service.platform.audit import Actor, Channel
from service.platform.auth import SCOPES, KeyCache, Principal
from service.platform.brokers import redis_client
from service.platform.errors import Unauthorized
from service.platform.settings import Settings


async def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_celery(request: Request) -> Celery:
    celery_app: Celery = request.app.state.celery_app
    return celery_app


async def get_session(runtime: Annotated[Runtime, Depends(get_runtime)]) -> AsyncIterator[Session]:
    """One session per request. Nothing is committed here: the route commits what it means to
    keep, and whatever it did not commit is rolled back when the session closes."""
    session = runtime.sessions()
    try:
        yield session
    finally:
        if session.in_transaction():
            await run_in_threadpool(session.close)
        else:
            session.close()


async def text_parameters(request: Request) -> None:
    """A NUL character is text no PostgreSQL column can hold or be compared with: in a path or
    query parameter it is an invalid parameter, refused before any route reads it."""
    for name, value in [*request.path_params.items(), *request.query_params.multi_items()]:
        if "\x00" in value:
            raise ApiError("invalid_query", f"{name} holds a NUL character", {"param": name})


async def bearer_token(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("missing or invalid API key")
    return token.strip()


def require(scope: str) -> Callable[..., Awaitable[Principal]]:
    """A dependency that authenticates the caller and checks that its key grants ``scope``."""
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}")

    async def dependency(
        request: Request, token: Annotated[str, Depends(bearer_token)]
    ) -> Principal:
        keys: KeyCache = request.app.state.keys
        principal = keys.cached(token)
        if principal is None:
            principal = await run_in_threadpool(_authenticate, request.app, keys, token)
        principal.require(scope)
        await check_rate(request.app, principal)
        return principal

    return dependency


def _authenticate(app: FastAPI, keys: KeyCache, token: str) -> Principal:
    """A session of its own, opened only when the key is not cached: most requests of a
    route that needs no database then open none."""
    runtime: Runtime = app.state.runtime
    with runtime.sessions() as session:
        return keys.authenticate(session, token)


@dataclass(frozen=True)
class Via:
    """The channel and the route a change came through, for its audit event: a route's own,
    or the dashboard's when one of its buttons calls the route function."""

    channel: Channel
    source: str

    def actor(self, principal: Principal) -> Actor:
        return Actor.of_key(principal, self.channel, self.source)


def route_of(request: Request) -> str:
    """``METHOD /path/{param}``: the route as declared, not the URL with its values."""
    route = request.scope.get("route")
    return f"{request.method} {getattr(route, 'path', request.url.path)}"


async def via_api(request: Request) -> Via:
    return Via("api", route_of(request))


async def via_ui(request: Request) -> Via:
    """A dashboard button, which calls the API's route function with this in place of its own."""
    return Via("ui", route_of(request))


SessionDep = Annotated[Session, Depends(get_session)]
RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
CeleryDep = Annotated[Celery, Depends(get_celery)]
Reader = Annotated[Principal, Depends(require("read"))]
Writer = Annotated[Principal, Depends(require("write"))]
Admin = Annotated[Principal, Depends(require("admin"))]
ViaDep = Annotated[Via, Depends(via_api)]
UiVia = Annotated[Via, Depends(via_ui)]


BROKER_PROBE_TIMEOUT_S = 1.0


@contextmanager
def broker_probe(settings: Settings) -> Iterator[redis.Redis]:
    """A short-lived broker client with a short timeout, for health and metrics probes."""
    client = redis_client(
        settings.broker(),
        socket_timeout=BROKER_PROBE_TIMEOUT_S,
        socket_connect_timeout=BROKER_PROBE_TIMEOUT_S,
    )
    try:
        yield client
    finally:
        client.close()
