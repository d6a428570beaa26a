"""The step cache through the API and the dashboard: a step that declares ``cache`` shows
``cached`` with the job and step it took its output from; ``refresh`` runs it again; a job
deleted by retention takes its cache rows with it; a step on an action that refuses the cache
is refused at submission naming the step and the field."""

import uuid
from typing import Any

import yaml
from fastapi.testclient import TestClient
from sqlalchemy import delete, func, select

from service.engine.runner import run_step
from service.engine.runtime import Runtime
from service.engine.steps import StepKey
from service.platform.db import unit_of_work
from service.platform.models import JobRow, StepCacheRow
from tests.api.conftest import KeyFactory
from tests.api.test_audit import Caller
from tests.api.test_mcp_audit import _tools

Headers = dict[str, str]


def _profile(action: str = "noop") -> dict[str, Any]:
    return {
        "name": f"cached-{uuid.uuid4().hex[:6]}",
        "params": {"topic": {"type": "string"}},
        "steps": [
            {"id": "s", "action": action, "with": {"topic": "${{ params.topic }}"}}
            | {"cache": {"ttl_s": 3600}}
        ],
    }


def _ran(client: TestClient, runtime: Runtime, headers: Headers, **body: Any) -> Any:
    response = client.post("/v1/jobs", json=body, headers=headers)
    assert response.status_code == 202, response.text
    job_id = uuid.UUID(response.json()["job"]["id"])
    run_step(runtime, StepKey(job_id, "s"), task_id=uuid.uuid4().hex)
    job = client.get(f"/v1/jobs/{job_id}", headers=headers).json()["job"]
    assert job["status"] == "succeeded", job
    return job


def test_a_second_run_shows_its_step_cached_with_its_source_and_refresh_runs_it(
    client: TestClient, runtime: Runtime, writer: Headers
) -> None:
    body = {"pipeline": _profile(), "params": {"topic": uuid.uuid4().hex}}
    first = _ran(client, runtime, writer, **body)
    second = _ran(client, runtime, writer, **body)
    refreshed = _ran(client, runtime, writer, **body, refresh=True)

    [ran], [cached], [again] = first["steps"], second["steps"], refreshed["steps"]
    assert (ran["status"], ran["cached_from"]) == ("succeeded", None)
    assert cached["status"] == "cached"
    assert cached["cached_from"] == {"job_id": first["id"], "step_id": "s"}
    assert (again["status"], again["cached_from"]) == ("succeeded", None)
    assert second["result"] == first["result"]


def test_the_mcp_run_pipeline_tool_asks_for_a_refresh(
    client: TestClient, runtime: Runtime, make_key: KeyFactory
) -> None:
    caller = Caller(make_key, "read", "write")
    call = _tools(client, runtime, caller)
    body = {"pipeline": _profile(), "params": {"topic": uuid.uuid4().hex}}
    first = _ran(client, runtime, caller.headers, **body)

    inline = yaml.safe_dump(body["pipeline"])
    job_id = call("run_pipeline", pipeline=inline, params=body["params"], refresh=True)["job"]["id"]
    run_step(runtime, StepKey(uuid.UUID(job_id), "s"), task_id=uuid.uuid4().hex)

    refreshed = client.get(f"/v1/jobs/{job_id}", headers=caller.headers).json()["job"]
    assert refreshed["steps"][0]["status"] == "succeeded"
    again = _ran(client, runtime, caller.headers, **body)
    assert again["steps"][0]["cached_from"] == {"job_id": job_id, "step_id": "s"}
    assert first["id"] != job_id


def test_the_dashboard_links_a_cached_step_to_its_source(
    client: TestClient, runtime: Runtime, make_key: KeyFactory
) -> None:
    key = make_key("write")
    headers = {"Authorization": f"Bearer {key}"}
    body = {"pipeline": _profile(), "params": {"topic": uuid.uuid4().hex}}
    first = _ran(client, runtime, headers, **body)
    second = _ran(client, runtime, headers, **body)
    login = client.post("/ui/login", data={"key": key, "next": "/ui/jobs"}, follow_redirects=False)
    assert login.status_code == 303, login.text

    page = client.get(f"/ui/jobs/{second['id']}/panel").text

    assert 'class="status cached"' in page
    assert f'href="/ui/jobs/{first["id"]}#step-s"' in page


def test_a_deleted_job_takes_its_cache_rows_with_it(
    client: TestClient, runtime: Runtime, writer: Headers
) -> None:
    body = {"pipeline": _profile(), "params": {"topic": uuid.uuid4().hex}}
    first = _ran(client, runtime, writer, **body)
    second = _ran(client, runtime, writer, **body)
    ids = [uuid.UUID(first["id"]), uuid.UUID(second["id"])]

    def rows() -> int:
        with unit_of_work(runtime.sessions) as session:
            count = select(func.count()).where(StepCacheRow.job_id.in_(ids))
            return int(session.scalar(count) or 0)

    assert rows() == 2
    with unit_of_work(runtime.sessions) as session:
        session.execute(delete(JobRow).where(JobRow.id.in_(ids)))
    assert rows() == 0


def test_a_step_on_an_action_that_refuses_the_cache_is_refused_naming_step_and_field(
    client: TestClient, writer: Headers
) -> None:
    body = {"pipeline": _profile(action="sleep"), "params": {"topic": "x"}}
    response = client.post("/v1/jobs", json=body, headers=writer)

    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "profile_invalid"
    [entry] = error["details"]["errors"]
    assert (entry["step"], entry["field"], entry["code"]) == (
        "s",
        "steps[0].cache",
        "cache_refused",
    )
    assert "step 's' field 'cache'" in error["message"]
