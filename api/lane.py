"""The common job submission, answered in front of FastAPI.

FastAPI's machinery around the jobs route (the route search, solving the dependencies, the
request object, the exception middleware) cost about 0.3 ms a request with nothing behind the
route; at 500 jobs a second, answering the common request without it took the API's CPU a job
from 1.42 to 1.28 ms (README, "The submission lane"). ``SubmitLane`` answers
``POST /v1/jobs`` itself when the request is the common kind: no query string, a key the
cache holds with the ``write`` scope, a JSON body within the cap that ``JobCreate`` accepts, in
``async`` mode. It makes the route's rate check, accepts through the route's ``accept`` and
sends the route's response. Any other request goes on to FastAPI as it came, with the body the
lane read given back, so every refusal has one implementation, the route's.
"""

import json
from collections import deque
from collections.abc import Iterable
from inspect import isawaitable

from fastapi import FastAPI, Request
from pydantic import ValidationError
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.routes import jobs
from api.schemas import JobCreate
from api.throttle import check_rate
from service.platform.audit import Actor
from service.platform.auth import KeyCache, Principal

SUBMIT_ROUTE = "POST /v1/jobs"
"""The route the lane answers for, as the audit trail names it (``api.deps.route_of``)."""


class SubmitLane:
    def __init__(self, app: ASGIApp, *, api: FastAPI, max_bytes: int) -> None:
        self.app = app
        self.api = api
        self.max_bytes = max_bytes
        self.route = _submit_route(jobs.router.routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        principal = self._principal(scope) if _is_submission(scope) else None
        if principal is None:
            await self.app(scope, receive, send)
            return
        messages, raw = await _read(receive, self.max_bytes)
        body = None if raw is None else _job_create(raw)
        if body is None:
            await self.app(scope, _replay(messages, receive), send)
            return
        scope["route"] = self.route
        try:
            await check_rate(self.api, principal)
            actor = Actor.of_key(principal, "api", SUBMIT_ROUTE)
            response = jobs.job_response(*await jobs.accept(self.api, body, principal, actor))
        except Exception as exc:
            response = await self._error(scope, exc)
        await response(scope, receive, send)

    def _principal(self, scope: Scope) -> Principal | None:
        """The caller, when its key is cached with the ``write`` scope and it declares a JSON body
        within the cap."""
        headers: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:
            headers.setdefault(name, value)
        media = headers.get(b"content-type", b"").split(b";", 1)[0].strip().lower()
        declared = headers.get(b"content-length", b"")
        if media != b"application/json" or not declared.isdigit():
            return None
        if int(declared) > self.max_bytes:
            return None
        scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        keys: KeyCache = self.api.state.keys
        principal = keys.cached(token.strip())
        return principal if principal is not None and principal.has("write") else None

    async def _error(self, scope: Scope, exc: Exception) -> Response:
        """The answer the app's exception handlers give, as the route's errors get."""
        handlers = self.api.exception_handlers
        for kind in type(exc).__mro__:
            handler = handlers.get(kind)
            if handler is not None:
                answer = handler(Request(scope), exc)
                response = await answer if isawaitable(answer) else answer
                assert isinstance(response, Response)
                return response
        raise exc


def _is_submission(scope: Scope) -> bool:
    return (
        scope["type"] == "http"
        and scope["method"] == "POST"
        and scope["path"] == "/v1/jobs"
        and not scope.get("root_path")
        and not scope.get("query_string")
    )


def _submit_route(routes: Iterable[BaseRoute]) -> BaseRoute:
    """The route the lane stands in for, named in the request metrics as FastAPI names it."""
    return next(route for route in routes if getattr(route, "endpoint", None) is jobs.create_job)


async def _read(receive: Receive, max_bytes: int) -> tuple[list[Message], bytes | None]:
    """The request's messages up to the end of its body, and the body if it ended within the
    cap; else up to the first message that is not body or passes the cap, and no body: the
    route then refuses it as it always has."""
    messages: list[Message] = []
    size = 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages, None
        size += len(message.get("body", b""))
        if size > max_bytes:
            return messages, None
        if not message.get("more_body", False):
            return messages, b"".join(m.get("body", b"") for m in messages)


def _job_create(raw: bytes) -> JobCreate | None:
    """The body as FastAPI reads it (``json.loads``, then the model), if it is valid and asks
    for no wait."""
    try:
        body = JobCreate.model_validate(json.loads(raw))
    except (ValueError, ValidationError, RecursionError):
        return None
    return body if body.mode == "async" else None


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = deque(messages)

    async def replayed() -> Message:
        return pending.popleft() if pending else await receive()

    return replayed
