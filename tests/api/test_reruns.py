"""POST /v1/jobs/{id}/rerun: a new job of a finished one, refused with a code when it cannot be."""

import uuid
from collections.abc import Callable
from typing import Any

import redis
from fastapi.testclient import TestClient
from sqlalchemy import update

from service.engine.runtime import Runtime
from service.platform.db import unit_of_work
from service.platform.models import JobRow, StepRunRow
from tests.api.conftest import GREET, KeyFactory
from tests.support.arrange import walk

Headers = dict[str, str]
QUEUE = "flowbeat.steps"


def _error(response: Any, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code


def _finished(runtime: Runtime, job_id: str, *, first_succeeded: bool = False) -> None:
    """The job as a worker would leave it: failed, its first step checkpointed or not."""
    with unit_of_work(runtime.sessions) as session:
        walk(session, JobRow, JobRow.id == job_id, to="failed")
        if first_succeeded:
            first = (StepRunRow.job_id == job_id, StepRunRow.step_id == "first")
            walk(session, StepRunRow, *first, to="succeeded")
            session.execute(update(StepRunRow).where(*first).values(output={"who": "ada"}))


def _job(client: TestClient, headers: Headers, pipeline: str = "greet") -> str:
    response = client.post(
        "/v1/jobs", json={"pipeline": pipeline, "params": {"who": "ada"}}, headers=headers
    )
    assert response.status_code == 202, response.text
    job_id: str = response.json()["job"]["id"]
    return job_id


def test_a_rerun_reuses_the_steps_before_from_step_and_sends_the_rest(
    client: TestClient, writer: Headers, runtime: Runtime, broker: redis.Redis
) -> None:
    parent = _job(client, writer)
    _finished(runtime, parent, first_succeeded=True)
    before = broker.llen(QUEUE)

    response = client.post(
        f"/v1/jobs/{parent}/rerun",
        json={"from_step": "second", "params": {"count": 2}},
        headers=writer,
    )

    assert response.status_code == 202, response.text
    job = response.json()["job"]
    assert (job["trigger"], job["parent_job_id"]) == ("rerun", parent)
    assert job["params"] == {"who": "ada", "count": 2}
    assert [(s["step_id"], s["status"]) for s in job["steps"]] == [
        ("first", "reused"),
        ("second", "pending"),
    ]
    assert broker.llen(QUEUE) == before + 1


def test_a_rerun_names_its_parent_and_is_listed_under_it(
    client: TestClient, writer: Headers, runtime: Runtime
) -> None:
    parent = _job(client, writer)
    _finished(runtime, parent)
    other = _job(client, writer)
    rerun = client.post(f"/v1/jobs/{parent}/rerun", json={}, headers=writer).json()["job"]

    read = client.get(f"/v1/jobs/{rerun['id']}", headers=writer).json()["job"]
    listed = client.get("/v1/jobs", params={"parent": parent}, headers=writer).json()["jobs"]
    upstream = client.get(f"/v1/jobs/{parent}", headers=writer).json()["job"]

    assert read["parent"] == {"job_id": parent, "relation": "rerun", "step_id": None}
    assert [job["id"] for job in listed] == [rerun["id"]]
    assert other not in {job["id"] for job in listed}
    assert (upstream["parent"], upstream["children"]) == (None, [])
    bad = client.get("/v1/jobs", params={"parent": "nope"}, headers=writer)
    assert (bad.status_code, bad.json()["error"]["code"]) == (400, "invalid_query")


def test_refused_reruns_answer_with_their_code_and_store_nothing(
    client: TestClient,
    writer: Headers,
    make_key: KeyFactory,
    runtime: Runtime,
    job_count: Callable[[], int],
) -> None:
    open_job = _job(client, writer)
    done = _job(client, writer)
    _finished(runtime, done)
    reader = {"Authorization": f"Bearer {make_key('read')}"}
    stored = job_count()

    _error(client.post(f"/v1/jobs/{open_job}/rerun", json={}, headers=writer), 409, "job_conflict")
    _error(
        client.post(f"/v1/jobs/{done}/rerun", json={"from_step": "nope"}, headers=writer),
        400,
        "unknown_step",
    )
    _error(
        client.post(
            f"/v1/jobs/{done}/rerun",
            json={"from_step": "second", "only_failed_items": True},
            headers=writer,
        ),
        422,
        "rerun_invalid",
    )
    _error(
        client.post(f"/v1/jobs/{done}/rerun", json={"params": {"bogus": 1}}, headers=writer),
        422,
        "params_invalid",
    )
    _error(client.post(f"/v1/jobs/{done}/rerun", json={}, headers=reader), 403, "forbidden")
    _error(
        client.post(f"/v1/jobs/{uuid.uuid4()}/rerun", json={}, headers=writer), 404, "job_not_found"
    )
    assert job_count() == stored


def test_a_job_whose_pipeline_version_was_deleted_cannot_be_rerun(
    client: TestClient, make_key: KeyFactory, runtime: Runtime
) -> None:
    headers = {"Authorization": f"Bearer {make_key('read', 'write')}"}
    name = f"gone-{uuid.uuid4().hex[:8]}"
    saved = client.put(
        f"/v1/pipelines/{name}",
        content=GREET.replace("name: greet", f"name: {name}"),
        headers={**headers, "Content-Type": "application/yaml"},
    )
    assert saved.status_code == 201, saved.text
    job = _job(client, headers, pipeline=name)
    _finished(runtime, job)
    assert client.delete(f"/v1/pipelines/{name}", headers=headers).status_code == 200

    _error(
        client.post(f"/v1/jobs/{job}/rerun", json={}, headers=headers), 409, "pipeline_version_gone"
    )
