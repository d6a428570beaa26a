"""``flowbeat mcp``: the MCP tools over stdio, for an agent that starts flowbeat as a subprocess.

The process acts as the API key in ``FLOWBEAT_MCP_KEY``, with that key's owner and scopes,
exactly as an HTTP client sending it would; it is checked before the first message is read,
and again (through the key cache) on every call, so a revoked key stops working.
"""

from service.cli.app import celery_app, cli, load_settings
from service.engine.runtime import Runtime
from service.platform.auth import KeyCache
from service.platform.errors import McpKeyRequired


@cli.command()
def mcp() -> None:
    """Serve the MCP tools (save, list, load, delete, history, schedule, run, job, diff) over
    stdio as the key in FLOWBEAT_MCP_KEY."""
    settings = load_settings()
    if settings.mcp_key is None:
        raise McpKeyRequired(
            "set FLOWBEAT_MCP_KEY to an API key (flowbeat keys create); the tools act as it", {}
        )
    from api.mcp import McpDeps, build_mcp

    token = settings.mcp_key.get_secret_value()
    runtime = Runtime.start(settings)
    keys = KeyCache(settings.auth_cache_s)
    with runtime.sessions() as session:
        keys.authenticate(session, token)
    deps = McpDeps(settings, runtime, celery_app(settings), keys, token=token)
    build_mcp(deps).run("stdio")
