"""The MCP job tools: ``run_pipeline`` says when the job it gives back is one its pipeline's
dedupe window matched, and names that job when the pipeline refuses duplicates."""

import uuid

import pytest
from fastapi.testclient import TestClient
from mcp.server.mcpserver.exceptions import ToolError

from service.engine.runtime import Runtime
from tests.api.conftest import KeyFactory
from tests.api.test_audit import Caller, events
from tests.api.test_mcp_audit import _tools


def test_run_pipeline_gives_back_the_open_job_a_duplicate_matches(
    client: TestClient, runtime: Runtime, make_key: KeyFactory
) -> None:
    caller = Caller(make_key, "read", "write")
    call = _tools(client, runtime, caller)
    params = {"query": f"crispr-{uuid.uuid4().hex[:6]}"}

    first = call("run_pipeline", pipeline="search", params=params)
    again = call("run_pipeline", pipeline="search", params=params)

    assert first["deduplicated"] is False
    assert again["deduplicated"] is True
    assert again["job"]["id"] == first["job"]["id"]
    assert [e.action for e in events(runtime, caller.owner)] == ["job.submit"]


def test_run_pipeline_refuses_a_duplicate_naming_the_job(
    client: TestClient, runtime: Runtime, make_key: KeyFactory
) -> None:
    call = _tools(client, runtime, Caller(make_key, "read", "write"))
    params = {"query": f"crispr-{uuid.uuid4().hex[:6]}"}
    first = call("run_pipeline", pipeline="search-once", params=params)

    with pytest.raises(ToolError, match="duplicate_job") as refused:
        call("run_pipeline", pipeline="search-once", params=params)

    assert first["job"]["id"] in str(refused.value)
