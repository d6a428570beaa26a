"""``/mcp``: the MCP tools over streamable HTTP, behind the same bearer keys, scopes and rate
limits as every route. The route checks the key and hands the untouched request to the SDK.

The SDK runs stateless with JSON answers, so any API replica can answer any MCP request.
Its DNS-rebinding check (a Host allow-list) is off: it guards servers that trust whoever can
reach them, and this one trusts only a bearer key, which a browser never attaches on its own.
"""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI, Request, Response
from mcp.server.mcpserver import MCPServer
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import ASGIApp, Receive, Scope, Send

from api.deps import Reader
from api.mcp import McpDeps, build_mcp

router = APIRouter(tags=["mcp"])


class _Handover(Response):
    """A response that lets the SDK answer the request itself."""

    def __init__(self, handler: ASGIApp) -> None:
        super().__init__()
        self._handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._handler(scope, receive, send)


@router.api_route("/mcp", methods=["GET", "POST", "DELETE"], include_in_schema=False)
async def mcp_endpoint(request: Request, _: Reader) -> Response:
    return _Handover(request.app.state.mcp_handler)


def install_mcp(app: FastAPI, deps: McpDeps) -> None:
    app.state.mcp_server = build_mcp(deps)
    app.include_router(router)


@asynccontextmanager
async def mcp_sessions(app: FastAPI) -> AsyncIterator[None]:
    """The SDK's session manager runs once; an app whose lifespan runs again (tests, an
    embedding server) gets a new one each time."""
    server: MCPServer = app.state.mcp_server
    server.streamable_http_app(
        stateless_http=True,
        json_response=True,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    app.state.mcp_handler = StreamableHTTPASGIApp(server.session_manager)
    async with server.session_manager.run():
        yield
