"""The MCP tools as an agent reaches them: the SDK's own client over streamable HTTP against a
live API, and over stdio against ``flowbeat mcp``, with real workers running the jobs."""

import json
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import Client as McpClient
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.types import TextResourceContents

from service.platform.auth import create_api_key
from service.platform.db import unit_of_work
from tests.e2e.conftest import ROOT, Cluster, Proc
from tests.e2e.conftest import Client as StackClient

TOOLS = {
    "save_pipeline",
    "list_pipelines",
    "load_pipeline",
    "delete_pipeline",
    "get_pipeline_history",
    "schedule_pipeline",
    "list_schedules",
    "run_pipeline",
    "get_job",
    "find_jobs",
    "get_diff",
    "get_logs",
    "send_signal",
    "list_actions",
}
PROFILE = """\
name: {name}
params:
  papers: {{type: array, default: []}}
steps:
  - id: fetch
    action: noop
    with: {{papers: "${{{{ params.papers }}}}"}}
result: {{step: fetch, items: papers, key: pmid}}
"""


def _key(client: StackClient, scope: str) -> str:
    with unit_of_work(client.rt.sessions) as session:
        key, _ = create_api_key(session, owner=f"mcp-{uuid.uuid4().hex[:6]}", scopes=[scope])
    return key


def _over_http(base: str, key: str) -> McpClient:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=30)
    return McpClient(streamable_http_client(f"{base}/mcp", http_client=http))


async def _call(mcp: McpClient, tool: str, **arguments: Any) -> Any:
    result = await mcp.call_tool(tool, arguments)
    assert not result.is_error, result.content
    return result.structured_content


async def _refusal(mcp: McpClient, tool: str, **arguments: Any) -> str:
    result = await mcp.call_tool(tool, arguments)
    assert result.is_error
    return " ".join(getattr(part, "text", "") for part in result.content)


async def _resource(mcp: McpClient, uri: str) -> str:
    contents = (await mcp.read_resource(uri)).contents[0]
    assert isinstance(contents, TextResourceContents)
    return contents.text


def _run(session: Callable[[], Awaitable[None]]) -> None:
    anyio.run(session)


@pytest.fixture
def api(cluster: Cluster) -> str:
    return cluster.api()


def test_an_agent_saves_runs_diffs_schedules_and_deletes_over_http(
    api: str, client: StackClient, shared_worker: Proc
) -> None:
    name = f"mcp-{uuid.uuid4().hex[:6]}"
    key = _key(client, "write")

    async def session() -> None:
        async with _over_http(api, key) as mcp:
            assert {tool.name for tool in (await mcp.list_tools()).tools} >= TOOLS
            saved = await _call(
                mcp, "save_pipeline", name=name, config=PROFILE.format(name=name), tags="a, b"
            )
            assert (saved["pipeline"]["version"], saved["pipeline"]["tags"]) == (1, ["a", "b"])
            listed = await _call(mcp, "list_pipelines", tag="a")
            assert [p["name"] for p in listed["pipelines"]] == [name]
            loaded = await _call(mcp, "load_pipeline", source=f"saved:{name}")
            assert f"name: {name}" in loaded["yaml"]
            plain = f"{name}-as-written"
            await _call(mcp, "save_pipeline", name=plain, config=PROFILE.format(name=plain))
            written = await _call(mcp, "load_pipeline", source=f"saved:{plain}")
            assert written["yaml"] == PROFILE.format(name=plain), "as saved, not re-serialised"

            first = await _call(
                mcp, "run_pipeline", pipeline=name, params={"papers": [{"pmid": "1"}]}
            )
            await _finished(mcp, first["job"]["id"])
            second = await _call(
                mcp,
                "run_pipeline",
                pipeline=name,
                params={"papers": [{"pmid": "1"}, {"pmid": "2"}]},
            )
            done = await _finished(mcp, second["job"]["id"])
            assert done["status"] == "succeeded"
            diff = await _call(mcp, "get_diff", job_id=second["job"]["id"])
            assert (diff["counts"], diff["items"]) == (
                {"new": 1, "removed": 0, "unchanged": 1},
                [{"pmid": "2"}],
            )
            history = await _call(mcp, "get_pipeline_history", name=name)
            assert [run["job_id"] for run in history["runs"]] == [
                second["job"]["id"],
                first["job"]["id"],
            ]
            assert history["latest_new_items"] == [{"pmid": "2"}]

            latest = await _resource(mcp, f"pipeline://history/{name}/latest")
            assert json.loads(latest)["run"]["job_id"] == second["job"]["id"]
            assert f"name: {name}" in await _resource(mcp, f"pipeline://saved/{name}")

            scheduled = await _call(mcp, "schedule_pipeline", name=name, cron="0 9 * * 1")
            assert scheduled["schedule"]["cron"] == "0 9 * * 1"
            assert scheduled["schedule"]["next_fire_at"] is not None
            assert (await _call(mcp, "schedule_pipeline", name=name, cron=""))["removed"]

            await _call(
                mcp, "schedule_pipeline", name=name, cron="0 6 * * *", schedule="daily", priority=7
            )
            monthly = await _call(
                mcp,
                "schedule_pipeline",
                name=name,
                cron="0 6 1 * *",
                schedule="monthly",
                params={"papers": [{"pmid": "3"}]},
            )
            mine = (await _call(mcp, "list_schedules", pipeline=name))["schedules"]
            assert [(s["name"], s["priority"], s["params"]) for s in mine] == [
                ("daily", 7, {}),
                ("monthly", None, {"papers": [{"pmid": "3"}]}),
            ]
            ambiguous = await _refusal(mcp, "schedule_pipeline", name=name, cron="0 7 * * *")
            assert "schedule_ambiguous" in ambiguous and monthly["schedule"]["id"] in ambiguous
            removed = await _call(
                mcp, "schedule_pipeline", name=name, cron="", schedule=monthly["schedule"]["id"]
            )
            assert removed["schedule_id"] == monthly["schedule"]["id"]
            assert (await _call(mcp, "delete_pipeline", name=name))["name"] == name
            assert "pipeline_not_found" in await _refusal(mcp, "load_pipeline", source=name)

    _run(session)


async def _finished(mcp: McpClient, job_id: str) -> Any:
    with anyio.fail_after(60):
        while True:
            job = (await _call(mcp, "get_job", job_id=job_id))["job"]
            if job["status"] in ("succeeded", "failed", "cancelled"):
                return job
            await anyio.sleep(0.1)


def test_a_read_key_cannot_write_and_an_import_of_a_private_address_is_refused(
    cluster: Cluster, client: StackClient
) -> None:
    api = cluster.api(import_allowed_hosts="169.254.169.254")
    key = _key(client, "read")

    async def session() -> None:
        async with _over_http(api, key) as mcp:
            assert (await _call(mcp, "list_pipelines"))["pipelines"]
            refused = await _refusal(mcp, "save_pipeline", name="nope", config="name: nope")
            assert "forbidden" in refused
            fetched = await _refusal(
                mcp, "load_pipeline", source="https://169.254.169.254/latest/profile.yaml"
            )
            assert "import_address_refused" in fetched

    _run(session)


def test_a_read_key_lists_the_actions_a_step_may_name_with_their_inputs(
    api: str, client: StackClient
) -> None:
    key = _key(client, "read")

    async def session() -> None:
        async with _over_http(api, key) as mcp:
            listed = {a["name"]: a for a in (await _call(mcp, "list_actions"))["actions"]}
            search = listed["pubmed.search"]
            assert search["input_schema"]["required"] == ["term"]
            assert (search["source"], search["cache"], search["retry"]) == ("builtin", False, True)
            assert listed["drill.count"]["module"] == "tests.drill_actions"
            assert listed["wait"]["source"] == "engine"

    _run(session)


def test_the_mcp_endpoint_answers_no_one_without_a_key(api: str) -> None:
    answer = httpx.post(f"{api}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})

    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == "unauthorized"


def _stdio_env(cluster: Cluster, key: str | None) -> dict[str, str]:
    env = {k: v for k, v in cluster.env.items() if k != "FLOWBEAT_MCP_KEY"}
    return env if key is None else {**env, "FLOWBEAT_MCP_KEY": key}


def test_flowbeat_mcp_serves_the_same_tools_over_stdio_as_its_key(
    cluster: Cluster, client: StackClient, shared_worker: Proc, tmp_path: Path
) -> None:
    writer, reader = _key(client, "write"), _key(client, "read")
    name = f"mcp-{uuid.uuid4().hex[:6]}"
    imports = tmp_path / "imports"
    imports.mkdir()
    (tmp_path / "outside.yaml").write_text(PROFILE.format(name=name), encoding="utf-8")

    def server(key: str) -> StdioServerParameters:
        return StdioServerParameters(
            command=sys.executable,
            args=["-m", "service.cli", "mcp"],
            env={**_stdio_env(cluster, key), "FLOWBEAT_IMPORT_DIR": str(imports)},
            cwd=str(ROOT),
        )

    async def session() -> None:
        async with McpClient(server(writer)) as mcp:
            await _call(mcp, "save_pipeline", name=name, config=PROFILE.format(name=name))
            job = (await _call(mcp, "run_pipeline", pipeline=name))["job"]
            assert (await _finished(mcp, job["id"]))["status"] == "succeeded"
        async with McpClient(server(reader)) as mcp:
            assert "forbidden" in await _refusal(mcp, "delete_pipeline", name=name)
            outside = await _refusal(mcp, "load_pipeline", source="file:../outside.yaml")
            assert "import_path_refused" in outside

    _run(session)


def test_flowbeat_mcp_without_a_key_says_which_setting_is_missing(cluster: Cluster) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "service.cli", "mcp"],
        env=_stdio_env(cluster, None),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
    )

    assert done.returncode != 0
    assert "mcp_key_required" in done.stdout + done.stderr
