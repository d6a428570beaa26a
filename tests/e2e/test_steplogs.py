"""Step logs on real processes: a prefork worker runs a pipeline whose action logs and prints,
with a retry and a fan-out whose items run side by side, and the lines come back over the
live API (a page, a follower that was there before they were written) and over MCP."""

import json
import uuid
from typing import Any

import anyio
import httpx
import httpx2
from mcp import Client as McpClient
from mcp.client.streamable_http import streamable_http_client

from flowbeat_client import Client as FlowbeatClient
from service.platform.auth import create_api_key
from service.platform.db import unit_of_work
from tests.e2e.conftest import Client, Cluster

PROFILE: dict[str, Any] = {
    "name": "chatty-e2e",
    "params": {"items": {"type": "array"}},
    "steps": [
        {
            "id": "flaky",
            "action": "drill.chatter",
            "with": {"lines": 2, "fail_attempts": 1},
            "retry": {"attempts": 2, "backoff_s": 0, "jitter": 0},
        },
        {
            "id": "each",
            "action": "drill.chatter",
            "depends_on": ["flaky"],
            "for_each": {"items": "${{ params.items }}", "max_parallel": 2},
            "with": {"lines": "${{ item }}", "hold_s": 0.2},
        },
    ],
}


def _headers(client: Client, scopes: list[str]) -> dict[str, str]:
    with unit_of_work(client.rt.sessions) as session:
        key, _ = create_api_key(session, owner=f"logs-{uuid.uuid4().hex[:6]}", scopes=scopes)
    return {"Authorization": f"Bearer {key}"}


def _follow(api: str, headers: dict[str, str], job_id: str) -> list[dict[str, Any]]:
    url = f"{api}/v1/jobs/{job_id}/steps/each/logs?follow=true"
    with httpx.stream("GET", url, headers=headers, timeout=60) as stream:
        assert stream.status_code == 200
        return [json.loads(raw) for raw in stream.iter_lines() if raw.strip()]


async def _get_logs(api: str, headers: dict[str, str], **arguments: Any) -> Any:
    http = httpx2.AsyncClient(headers=headers, timeout=30)
    async with McpClient(streamable_http_client(f"{api}/mcp", http_client=http)) as mcp:
        result = await mcp.call_tool("get_logs", arguments)
        assert not result.is_error, result.content
        return result.structured_content


def test_a_worker_keeps_what_each_attempt_said_and_the_api_and_mcp_give_it_back(
    cluster: Cluster, client: Client
) -> None:
    worker = cluster.worker(concurrency=2)
    api = cluster.api()
    headers = _headers(client, ["read", "write"])
    submitted = httpx.post(
        f"{api}/v1/jobs",
        json={"pipeline": PROFILE, "params": {"items": [1, 2, 3]}},
        headers=headers,
        timeout=30,
    )
    assert submitted.status_code == 202, submitted.text
    job_id = submitted.json()["job"]["id"]

    followed = _follow(api, headers, job_id)
    job = httpx.get(f"{api}/v1/jobs/{job_id}", headers=headers, timeout=30).json()["job"]
    flaky = httpx.get(
        f"{api}/v1/jobs/{job_id}/steps/flaky/logs", headers=headers, timeout=30
    ).json()
    each = httpx.get(f"{api}/v1/jobs/{job_id}/steps/each/logs", headers=headers, timeout=30)
    second = anyio.run(_agent_reads_attempt_two, api, headers, job_id)
    with FlowbeatClient(api, headers["Authorization"].removeprefix("Bearer ")) as fb:
        first_page = fb.jobs.logs(job_id, "each", limit=4)
        rest = fb.jobs.logs(job_id, "each", after=first_page["next_after"])

    assert job["status"] == "succeeded"
    assert [(line["attempt"], line["message"]) for line in flaky["lines"]] == [
        (attempt, message)
        for attempt in (1, 2)
        for message in (
            f"ctx line 1 of attempt {attempt}",
            "logger line 1",
            "printed line 1",
            f"ctx line 2 of attempt {attempt}",
            "logger line 2",
            "printed line 2",
        )
    ]
    by_shard: dict[int, list[str]] = {}
    for line in each.json()["lines"]:
        by_shard.setdefault(line["shard"], []).append(line["message"])
    assert by_shard == {
        item - 1: [
            message
            for n in range(1, item + 1)
            for message in (f"ctx line {n} of attempt 1", f"logger line {n}", f"printed line {n}")
        ]
        for item in (1, 2, 3)
    }, "items that ran side by side keep their own lines"
    assert followed == each.json()["lines"], "a follower from before the lines gets them all"
    assert second["lines"] == flaky["lines"][6:]
    assert (first_page["more"], rest["more"]) == (True, False)
    assert first_page["lines"] + rest["lines"] == each.json()["lines"]
    assert "printed line 2" in worker.output(), "the worker's own log still has what was printed"


async def _agent_reads_attempt_two(api: str, headers: dict[str, str], job_id: str) -> Any:
    return await _get_logs(api, headers, job_id=job_id, step_id="flaky", attempt=2)
