"""The MCP tools in the audit trail: each change a tool makes records one event of the ``mcp``
channel naming the tool; a tool refused for its key's scope records nothing."""

import uuid
from typing import Any

import anyio
import pytest
from fastapi.testclient import TestClient
from mcp.server.mcpserver.exceptions import ToolError

from api.mcp import McpDeps, build_mcp
from service.engine.claims import claim_step
from service.engine.runtime import Runtime
from service.engine.steps import StepKey
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from tests.api.conftest import KeyFactory
from tests.api.test_audit import Caller, events

PROFILE = """\
name: mcp-saved
steps:
  - {id: wait, action: noop, wait_for: {signal: go}}
"""


def _tools(client: TestClient, runtime: Runtime, caller: Caller) -> Any:
    state = client.app.state  # type: ignore[attr-defined]
    deps = McpDeps(state.settings, runtime, state.celery_app, state.keys, token=caller.key)
    server = build_mcp(deps)

    def call(tool: str, **arguments: Any) -> Any:
        async def go() -> Any:
            return await server.call_tool(tool, arguments)

        return anyio.run(go).structured_content

    return call


def test_each_tool_that_changes_something_records_itself(
    client: TestClient, runtime: Runtime, make_key: KeyFactory
) -> None:
    caller = Caller(make_key, "read", "write")
    call = _tools(client, runtime, caller)

    call("save_pipeline", name="mcp-saved", config=PROFILE)
    job_id = call("run_pipeline", pipeline="mcp-saved")["job"]["id"]
    with unit_of_work(runtime.sessions) as session:
        step = StepKey(uuid.UUID(job_id), "wait")
        assert claim_step(session, step, task_id="t", lease_s=30, now=utcnow()) is None
    call("send_signal", job_id=job_id, name="go")
    created = call("schedule_pipeline", name="mcp-saved", cron="0 * * * *")
    call("schedule_pipeline", name="mcp-saved", cron="0 6 * * *")
    call("schedule_pipeline", name="mcp-saved")
    call("delete_pipeline", name="mcp-saved")

    schedule_id = created["schedule"]["id"]
    trail = [(e.action, e.target_id, e.source) for e in events(runtime, caller.owner)]
    assert trail == [
        ("pipeline.save", "mcp-saved", "mcp save_pipeline"),
        ("job.submit", job_id, "mcp run_pipeline"),
        ("job.signal", job_id, "mcp send_signal"),
        ("schedule.create", schedule_id, "mcp schedule_pipeline"),
        ("schedule.update", schedule_id, "mcp schedule_pipeline"),
        ("schedule.delete", schedule_id, "mcp schedule_pipeline"),
        ("pipeline.delete", "mcp-saved", "mcp delete_pipeline"),
    ]
    assert {(e.channel, e.actor) for e in events(runtime, caller.owner)} == {("mcp", caller.prefix)}


def test_a_tool_refused_for_its_scope_records_nothing(
    client: TestClient, runtime: Runtime, make_key: KeyFactory
) -> None:
    reader = Caller(make_key, "read")
    call = _tools(client, runtime, reader)

    with pytest.raises(ToolError, match="forbidden"):
        call("save_pipeline", name="mcp-saved", config=PROFILE)
    with pytest.raises(ToolError, match="forbidden"):
        call("run_pipeline", pipeline="greet", params={"who": "a"})

    assert events(runtime, reader.owner) == []
