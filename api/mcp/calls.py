"""What every MCP tool does around its work: who calls (the bearer key of the request, or the
stdio server's one key), within which scope, in a session of its own in a worker thread, with
a refusal as a tool error whose text starts with the REST API's error code."""

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import yaml
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from sqlalchemy.orm import Session

from api.routes.pipelines import PipelinePublic
from service.catalogue.pipelines import PipelineView
from service.engine.runtime import Runtime
from service.platform.audit import Actor
from service.platform.auth import KeyCache, Principal
from service.platform.errors import FlowbeatError, JobNotFound, Unauthorized
from service.platform.settings import Settings

if TYPE_CHECKING:
    from celery import Celery

T = TypeVar("T")


@dataclass(frozen=True)
class McpDeps:
    settings: Settings
    runtime: Runtime
    celery_app: "Celery"
    keys: KeyCache
    token: str | None = None
    """The one key of a stdio server; over HTTP each request brings its own."""


def _token(deps: McpDeps, ctx: Context) -> str:
    if deps.token is not None:
        return deps.token
    scheme, _, token = (ctx.headers or {}).get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ToolError(f"{Unauthorized.code}: missing or invalid API key")
    return token.strip()


async def call(
    deps: McpDeps, ctx: Context, scope: str, work: Callable[[Session, Principal], T]
) -> T:
    """Run ``work`` in a worker thread with its own session, as the caller, within ``scope``."""
    token = _token(deps, ctx)

    def run() -> T:
        with deps.runtime.sessions() as session:
            try:
                principal = deps.keys.authenticate(session, token)
                principal.require(scope)
                return work(session, principal)
            except FlowbeatError as exc:
                raise ToolError(f"{exc.code}: {exc.message}") from None

    return await anyio.to_thread.run_sync(run)


def acting(principal: Principal, tool: str) -> Actor:
    return Actor.of_key(principal, "mcp", f"mcp {tool}")


def admin(principal: Principal) -> bool:
    return principal.has("admin")


def visible_to(principal: Principal) -> str | None:
    return None if admin(principal) else principal.owner


def public(view: PipelineView) -> dict[str, Any]:
    return PipelinePublic.of(view).model_dump(mode="json")


def as_yaml(view: PipelineView) -> str:
    """The text the version was saved from, as a person wrote it; re-serialised only when no
    text was kept."""
    if view.source is not None:
        return view.source
    return yaml.safe_dump(view.profile.to_json(), sort_keys=False, allow_unicode=True)


def job_id_of(raw: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise JobNotFound(f"no job {raw}", {"job_id": raw}) from None
