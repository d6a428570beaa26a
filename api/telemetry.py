"""Request latency by route template, method and status class, as pure ASGI.

The route is the template FastAPI matched (``/v1/jobs/{job_id}``), never the raw path, so
ids never become label values; a request no route matched counts as ``unmatched``.
"""

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.platform.metrics import API_REQUEST_SECONDS


class RequestMetrics:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            API_REQUEST_SECONDS.labels(route, scope["method"], f"{status // 100}xx").observe(
                time.perf_counter() - started
            )
