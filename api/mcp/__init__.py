"""The MCP tools: what an agent uses to save, run and schedule pipelines.

Each tool is a thin entry point like a route: it authenticates the caller's key, checks its
scope, calls ``service/`` in its own session and commits (``calls``). Answers are the REST
API's own response models, so an agent and a script read the same shapes. A refusal is a tool
error whose text starts with the error code the REST API would answer with.

Over HTTP the bearer key of each request is the caller (the route checked it and its rate
before the SDK saw the request); over stdio, ``flowbeat mcp`` holds one key for the process.
"""

from mcp.server.mcpserver import MCPServer

from api.mcp.actions import action_tools
from api.mcp.calls import McpDeps
from api.mcp.jobs import job_tools
from api.mcp.pipelines import pipeline_tools, resources

__all__ = ["McpDeps", "build_mcp"]

INSTRUCTIONS = (
    "flowbeat runs YAML pipelines on workers. list_actions shows the actions a step may "
    "name, with their inputs; save_pipeline stores a pipeline (a new version when it "
    "changes), run_pipeline starts a job, get_job follows it, get_diff shows what a run found "
    "that the run before it did not, schedule_pipeline runs it on a cron (several schedules per "
    "pipeline by name), list_schedules shows them, send_signal resumes a step that waits for a "
    "signal."
)


def build_mcp(deps: McpDeps) -> MCPServer:
    server: MCPServer = MCPServer("flowbeat", instructions=INSTRUCTIONS)
    pipeline_tools(server, deps)
    job_tools(server, deps)
    action_tools(server, deps)
    resources(server, deps)
    return server
