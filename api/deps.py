"""Request dependencies: a database session per request and bearer-key authentication."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated

import redis
from celery import Celery
from fastapi import Depends, Request
from sqlalchemy.orm import Session

from service.auth import SCOPES, KeyCache, Principal
from service.errors import Unauthorized
from service.runtime import Runtime
from service.settings import Settings


def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_celery(request: Request) -> Celery:
    celery_app: Celery = request.app.state.celery_app
    return celery_app


def get_session(runtime: Annotated[Runtime, Depends(get_runtime)]) -> Iterator[Session]:
    """One session per request. Nothing is committed here: the route commits what it means to
    keep, and whatever it did not commit is rolled back when the session closes."""
    with runtime.sessions() as session:
        yield session


def bearer_token(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("missing or invalid API key")
    return token.strip()


def require(scope: str) -> Callable[..., Principal]:
    """A dependency that authenticates the caller and checks that its key grants ``scope``."""
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}")

    def dependency(
        request: Request,
        token: Annotated[str, Depends(bearer_token)],
        session: Annotated[Session, Depends(get_session)],
    ) -> Principal:
        keys: KeyCache = request.app.state.keys
        principal = keys.authenticate(session, token)
        principal.require(scope)
        return principal

    return dependency


SessionDep = Annotated[Session, Depends(get_session)]
RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
CeleryDep = Annotated[Celery, Depends(get_celery)]
Reader = Annotated[Principal, Depends(require("read"))]
Writer = Annotated[Principal, Depends(require("write"))]


BROKER_PROBE_TIMEOUT_S = 1.0


@contextmanager
def broker_probe(settings: Settings) -> Iterator[redis.Redis]:
    """A short-lived broker client with a short timeout, for health and metrics probes."""
    client = redis.Redis.from_url(
        settings.require_broker_url(),
        socket_timeout=BROKER_PROBE_TIMEOUT_S,
        socket_connect_timeout=BROKER_PROBE_TIMEOUT_S,
    )
    try:
        yield client
    finally:
        client.close()
