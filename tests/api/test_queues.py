"""A job's priority and its steps' queues, as a client sets and reads them over the API."""

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from tasks.queues import queue_lists, queue_name, step_list

Headers = dict[str, str]


@pytest.fixture
def gpu(broker: redis.Redis) -> Iterator[str]:
    """A queue of this test's own, emptied after it."""
    name = f"gpu{uuid.uuid4().hex[:6]}"
    yield name
    broker.delete(*queue_lists(queue_name(name)))


def _routed(queue: str, priority: int | None = None) -> dict[str, Any]:
    profile: dict[str, Any] = {
        "name": "routed",
        "queue": queue,
        "steps": [{"id": "only", "action": "noop"}],
    }
    if priority is not None:
        profile["priority"] = priority
    return profile


def test_a_job_goes_to_its_queue_at_the_priority_it_was_given(
    client: TestClient, writer: Headers, broker: redis.Redis, gpu: str
) -> None:
    response = client.post(
        "/v1/jobs", json={"pipeline": _routed(gpu), "priority": 8}, headers=writer
    )

    assert response.status_code == 202, response.text
    assert response.json()["job"]["priority"] == 8
    assert broker.llen(step_list(gpu, 8)) == 1
    job_id = response.json()["job"]["id"]
    assert client.get(f"/v1/jobs/{job_id}", headers=writer).json()["job"]["priority"] == 8


def test_a_job_without_a_priority_takes_its_profiles(
    client: TestClient, writer: Headers, broker: redis.Redis, gpu: str
) -> None:
    response = client.post("/v1/jobs", json={"pipeline": _routed(gpu, 3)}, headers=writer)

    assert response.json()["job"]["priority"] == 3
    assert broker.llen(step_list(gpu, 3)) == 1


@pytest.mark.parametrize("priority", [-1, 10, "high", 2.5])
def test_a_priority_outside_0_to_9_is_refused_and_nothing_is_stored(
    client: TestClient, writer: Headers, broker: redis.Redis, gpu: str, priority: Any
) -> None:
    response = client.post(
        "/v1/jobs", json={"pipeline": _routed(gpu), "priority": priority}, headers=writer
    )

    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "validation_error"
    assert not any(broker.llen(key) for key in queue_lists(queue_name(gpu)))


def test_a_queue_name_that_cannot_be_one_names_the_step_and_field(
    client: TestClient, writer: Headers
) -> None:
    profile = {"name": "bad", "steps": [{"id": "only", "action": "noop", "queue": "GPU pool"}]}
    response = client.post("/v1/jobs", json={"pipeline": profile}, headers=writer)

    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "profile_invalid"
    assert "step 'only' field 'queue'" in error["message"]


def test_queues_lists_what_waits_where(client: TestClient, writer: Headers, gpu: str) -> None:
    for priority in (0, 5):
        client.post(
            "/v1/jobs", json={"pipeline": _routed(gpu), "priority": priority}, headers=writer
        )

    listed = client.get("/v1/queues", headers=writer)

    assert listed.status_code == 200, listed.text
    queues = {queue["name"]: queue for queue in listed.json()["queues"]}
    mine = queues[gpu]
    assert (mine["depth"], mine["by_priority"], mine["workers"]) == (2, {"5": 1, "0": 1}, [])
    assert mine["oldest_age_s"] >= 0
    assert "default" in queues


def test_queues_needs_a_key(client: TestClient) -> None:
    assert client.get("/v1/queues").status_code == 401


def test_a_rerun_keeps_its_parents_priority_unless_given_another(
    client: TestClient, writer: Headers, gpu: str
) -> None:
    parent = client.post(
        "/v1/jobs", json={"pipeline": _routed(gpu), "priority": 6}, headers=writer
    ).json()["job"]["id"]
    client.post(f"/v1/jobs/{parent}/cancel", headers=writer)

    kept = client.post(f"/v1/jobs/{parent}/rerun", json={}, headers=writer)
    given = client.post(f"/v1/jobs/{parent}/rerun", json={"priority": 1}, headers=writer)

    assert kept.status_code == 202, kept.text
    assert kept.json()["job"]["priority"] == 6
    assert given.json()["job"]["priority"] == 1
