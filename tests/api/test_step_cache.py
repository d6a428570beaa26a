"""The step cache through the API: a step that declares ``cache`` shows ``cached`` with the job
and step it took its output from; ``refresh`` runs it again; a step on an action that refuses
the cache is refused at submission naming the step and the field."""

import uuid
from typing import Any

from fastapi.testclient import TestClient

from service.engine.runner import run_step
from service.engine.runtime import Runtime
from service.engine.steps import StepKey

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
