"""``GET /v1/jobs/{id}/steps/{step_id}/logs``: a step's lines, paged by cursor, one attempt's
on request, read with the job's read rules, and followed live as the job's events are."""

import asyncio
import json
import threading
import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.streams import Framing, LogFilter, log_stream
from service.engine.runner import run_step
from service.engine.runtime import Runtime
from service.engine.steps import StepKey
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from service.platform.errors import RetryLater
from service.platform.listener import EventListener
from service.platform.models import PrunedJobRow
from tests.api.conftest import KeyFactory

Headers = dict[str, str]


def _chatty(lines: int, fail_attempts: int = 0) -> dict[str, Any]:
    return {
        "name": "chatty",
        "steps": [
            {
                "id": "talk",
                "action": "drill.chatter",
                "with": {"lines": lines, "fail_attempts": fail_attempts},
                "retry": {"attempts": 2, "backoff_s": 0, "jitter": 0},
            }
        ],
    }


def _submit(client: TestClient, headers: Headers, profile: dict[str, Any]) -> str:
    answer = client.post("/v1/jobs", json={"pipeline": profile, "params": {}}, headers=headers)
    assert answer.status_code == 202, answer.text
    job_id: str = answer.json()["job"]["id"]
    return job_id


def _ran(runtime: Runtime, client: TestClient, headers: Headers, lines: int = 2) -> str:
    job_id = _submit(client, headers, _chatty(lines))
    run_step(runtime, StepKey(uuid.UUID(job_id), "talk"), task_id=uuid.uuid4().hex)
    return job_id


def _logs(client: TestClient, headers: Headers, job_id: str, query: str = "") -> Any:
    answer = client.get(f"/v1/jobs/{job_id}/steps/talk/logs{query}", headers=headers)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_a_step_s_lines_come_oldest_first_with_what_they_belong_to(
    client: TestClient, runtime: Runtime, writer: Headers
) -> None:
    job_id = _ran(runtime, client, writer)

    page = _logs(client, writer, job_id)

    assert [(line["level"], line["logger"], line["message"]) for line in page["lines"]] == [
        ("INFO", "flowbeat.step", "ctx line 1 of attempt 1"),
        ("WARNING", "tests.drill_actions", "logger line 1"),
        ("INFO", "stdout", "printed line 1"),
        ("INFO", "flowbeat.step", "ctx line 2 of attempt 1"),
        ("WARNING", "tests.drill_actions", "logger line 2"),
        ("INFO", "stdout", "printed line 2"),
    ]
    first = page["lines"][0]
    assert (first["step_id"], first["shard"], first["attempt"], first["round"]) == (
        "talk",
        None,
        1,
        1,
    )
    assert first["ts"].endswith("+00:00")
    assert page["more"] is False
    assert page["next_after"] == page["lines"][-1]["id"]


def test_pages_follow_each_other_by_cursor(
    client: TestClient, runtime: Runtime, writer: Headers
) -> None:
    job_id = _ran(runtime, client, writer, lines=3)
    every = _logs(client, writer, job_id)["lines"]

    first = _logs(client, writer, job_id, "?limit=5")
    second = _logs(client, writer, job_id, f"?limit=5&after={first['next_after']}")
    last = _logs(client, writer, job_id, f"?limit=5&after={second['next_after']}")

    assert (first["more"], second["more"]) == (True, False)
    assert first["lines"] + second["lines"] == every
    assert last == {"lines": [], "next_after": second["next_after"], "more": False}


def test_one_attempt_s_lines_on_request(
    client: TestClient, runtime: Runtime, writer: Headers
) -> None:
    job_id = _submit(client, writer, _chatty(1, fail_attempts=1))
    key = StepKey(uuid.UUID(job_id), "talk")
    with pytest.raises(RetryLater):
        run_step(runtime, key, task_id=uuid.uuid4().hex)
    run_step(runtime, key, task_id=uuid.uuid4().hex)

    every = _logs(client, writer, job_id)["lines"]
    second = _logs(client, writer, job_id, "?attempt=2")["lines"]

    assert [line["attempt"] for line in every] == [1, 1, 1, 2, 2, 2]
    assert second == every[3:]


def test_logs_are_read_as_the_job_is(
    client: TestClient, runtime: Runtime, writer: Headers, make_key: KeyFactory
) -> None:
    job_id = _ran(runtime, client, writer)
    stranger = {"Authorization": f"Bearer {make_key('read')}"}
    admin = {"Authorization": f"Bearer {make_key('read', 'admin')}"}

    unauthenticated = client.get(f"/v1/jobs/{job_id}/steps/talk/logs")
    hidden = client.get(f"/v1/jobs/{job_id}/steps/talk/logs", headers=stranger)

    assert unauthenticated.status_code == 401
    assert hidden.status_code == 404
    assert hidden.json()["error"]["code"] == "job_not_found"
    assert len(_logs(client, admin, job_id)["lines"]) == 6


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        ("/v1/jobs/{job}/steps/nope/logs", 404, "step_not_found"),
        ("/v1/jobs/{missing}/steps/talk/logs", 404, "job_not_found"),
        ("/v1/jobs/not-an-id/steps/talk/logs", 404, "job_not_found"),
        ("/v1/jobs/{job}/steps/talk/logs?attempt=0", 400, "invalid_query"),
        ("/v1/jobs/{job}/steps/talk/logs?limit=0", 400, "invalid_query"),
    ],
)
def test_refusals(client: TestClient, writer: Headers, path: str, status: int, code: str) -> None:
    job_id = _submit(client, writer, _chatty(1))
    answer = client.get(path.format(job=job_id, missing=uuid.uuid4()), headers=writer)
    assert answer.status_code == status
    assert answer.json()["error"]["code"] == code


def test_a_pruned_job_s_logs_are_gone_not_unknown(
    client: TestClient, runtime: Runtime, make_key: KeyFactory
) -> None:
    owner = f"pruned-{uuid.uuid4().hex[:6]}"
    headers = {"Authorization": f"Bearer {make_key('read', owner=owner)}"}
    job_id = uuid.uuid4()
    with unit_of_work(runtime.sessions) as session:
        session.add(
            PrunedJobRow(
                job_id=job_id, owner=owner, pipeline="chatty", finished_at=None, pruned_at=utcnow()
            )
        )

    answer = client.get(f"/v1/jobs/{job_id}/steps/talk/logs", headers=headers)

    assert answer.status_code == 410
    assert answer.json()["error"]["code"] == "job_expired"


def test_following_a_settled_job_s_step_gives_its_lines_and_ends(
    client: TestClient, runtime: Runtime, writer: Headers
) -> None:
    job_id = _ran(runtime, client, writer)

    ndjson = client.get(f"/v1/jobs/{job_id}/steps/talk/logs?follow=true", headers=writer)
    sse = client.get(
        f"/v1/jobs/{job_id}/steps/talk/logs?follow=true&after=0",
        headers={**writer, "Accept": "text/event-stream", "Last-Event-ID": "0"},
    )

    assert ndjson.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(raw) for raw in ndjson.text.splitlines() if raw]
    assert [line["message"] for line in lines][-1] == "printed line 2"
    assert len(lines) == 6
    assert sse.text.startswith("retry: 2000\n\n")
    assert f"id: {lines[0]['id']}\ndata: " in sse.text
    assert sse.text.endswith("event: end\ndata: {}\n\n")


def test_a_follower_reconnecting_to_a_settled_job_with_nothing_new_is_told_to_stop(
    client: TestClient, runtime: Runtime, writer: Headers
) -> None:
    job_id = _ran(runtime, client, writer)
    last = _logs(client, writer, job_id)["next_after"]
    sse = {**writer, "Accept": "text/event-stream"}

    done = client.get(
        f"/v1/jobs/{job_id}/steps/talk/logs?follow=true",
        headers={**sse, "Last-Event-ID": str(last)},
    )
    behind = client.get(
        f"/v1/jobs/{job_id}/steps/talk/logs?follow=true",
        headers={**sse, "Last-Event-ID": str(last - 1)},
    )

    assert done.status_code == 204
    assert behind.status_code == 200
    assert behind.text.count("id: ") == 1, "the last line again, then the end"


async def _follow(runtime: Runtime, listener: EventListener, job_id: uuid.UUID) -> list[str]:
    which = LogFilter(job_id, "talk", None)
    frames = [
        frame async for frame in log_stream(runtime, listener, which, 0, Framing(sse=False), 5.0)
    ]
    return [json.loads(frame)["message"] for frame in frames if frame.strip()]


@pytest.mark.e2e  # waits on a thread that runs the attempts while the stream follows
def test_a_follower_gets_lines_as_the_attempt_writes_them_and_stops_when_the_job_ends(
    client: TestClient, runtime: Runtime, writer: Headers
) -> None:
    job_id = uuid.UUID(_submit(client, writer, _chatty(1, fail_attempts=1)))
    key = StepKey(job_id, "talk")
    listener = EventListener(runtime.settings.require_database_url()).start()

    def attempts() -> None:
        with pytest.raises(RetryLater):
            run_step(runtime, key, task_id=uuid.uuid4().hex)
        run_step(runtime, key, task_id=uuid.uuid4().hex)

    worker = threading.Timer(0.3, attempts)
    worker.start()
    try:
        messages = asyncio.run(asyncio.wait_for(_follow(runtime, listener, job_id), 30))
    finally:
        worker.join()
        listener.stop()

    assert messages == [
        "ctx line 1 of attempt 1",
        "logger line 1",
        "printed line 1",
        "ctx line 1 of attempt 2",
        "logger line 1",
        "printed line 1",
    ]
