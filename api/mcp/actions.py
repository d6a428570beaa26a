"""The MCP tool that lists the actions a profile's steps may name, so an agent writing a
pipeline calls what exists, with the inputs it takes, before ``save_pipeline``."""

from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from sqlalchemy.orm import Session

from api.mcp.calls import McpDeps, call
from api.routes.actions import catalogue
from service.platform.auth import Principal


def action_tools(server: MCPServer, deps: McpDeps) -> None:
    @server.tool()
    async def list_actions(ctx: Context) -> dict[str, Any]:
        """Every action a step's ``action:`` may name here, as ``GET /v1/actions`` lists it:
        its docstring, its inputs (``with:``) as JSON Schema, and whether its output may be
        cached and a failed attempt retried."""

        def work(session: Session, principal: Principal) -> dict[str, Any]:
            return catalogue(deps.runtime.registry).model_dump(mode="json")

        return await call(deps, ctx, "read", work)
