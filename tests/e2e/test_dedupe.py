"""Dedupe windows on real processes: two API processes sent the same dedupe key at once store
one job, every other request getting that job back (``deduplicated: true``) or, under
``on_duplicate: reject``, ``409 duplicate_job`` naming it; once a worker has run the job, a
request within the window still gets it back."""

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from sqlalchemy import select

from service.platform.auth import create_api_key
from service.platform.db import unit_of_work
from service.platform.models import JobRow
from tests.e2e.conftest import Client, Cluster, wait_for

PER_API = 8
"""Requests each API process gets at once: more than the first request of a batch, so the
batched intake and the single statement both meet the key."""


def _owner_headers(client: Client) -> tuple[str, dict[str, str]]:
    owner = f"dd-{uuid.uuid4().hex[:8]}"
    with unit_of_work(client.rt.sessions) as session:
        key, _ = create_api_key(session, owner=owner, scopes=("read", "write"))
    return owner, {"Authorization": f"Bearer {key}"}


def _warm(bases: list[str], headers: dict[str, str], pipeline: str) -> None:
    """Each API holds the key and has resolved the pipeline's name, as for a client that has
    submitted before: its requests then take the lane and the batched intake."""
    for base in bases:
        body = {"pipeline": pipeline, "params": {"query": f"warm-{uuid.uuid4().hex[:6]}"}}
        assert httpx.post(f"{base}/v1/jobs", json=body, headers=headers).status_code == 202


def _race(bases: list[str], headers: dict[str, str], body: dict[str, Any]) -> list[Any]:
    """Every request sent at one moment, ``PER_API`` to each API, on warm connections."""
    targets = [base for base in bases for _ in range(PER_API)]
    start = threading.Barrier(len(targets))

    def send(base: str) -> Any:
        with httpx.Client(base_url=base, headers=headers, timeout=30) as http:
            assert http.get("/v1/jobs", params={"limit": 1}).status_code == 200
            start.wait()
            return http.post("/v1/jobs", json=body)

    with ThreadPoolExecutor(len(targets)) as pool:
        return list(pool.map(send, targets))


def _stored(client: Client, owner: str, query: str) -> list[uuid.UUID]:
    with unit_of_work(client.rt.sessions) as session:
        return list(
            session.scalars(
                select(JobRow.id).where(JobRow.owner == owner, JobRow.dedupe_key == query)
            )
        )


def test_two_apis_racing_one_dedupe_key_store_one_job_and_answer_it_to_everyone(
    cluster: Cluster, client: Client
) -> None:
    bases = [cluster.api(), cluster.api()]
    owner, headers = _owner_headers(client)
    _warm(bases, headers, "search")
    query = f"crispr-{uuid.uuid4().hex[:6]}"

    answers = _race(bases, headers, {"pipeline": "search", "params": {"query": query}})

    [job_id] = _stored(client, owner, query)
    statuses = sorted(answer.status_code for answer in answers)
    assert statuses == [200] * (len(answers) - 1) + [202], [a.text for a in answers]
    for answer in answers:
        body = answer.json()
        assert body["job"]["id"] == str(job_id)
        assert body["deduplicated"] is (answer.status_code == 200)

    cluster.worker()
    done = wait_for(lambda: _status(client, job_id) == "succeeded", 60, "the job to succeed")
    later = httpx.post(
        f"{bases[1]}/v1/jobs",
        json={"pipeline": "search", "params": {"query": query}},
        headers=headers,
    )
    assert done and later.status_code == 200, later.text
    assert (later.json()["deduplicated"], later.json()["job"]["id"]) == (True, str(job_id))
    assert later.json()["job"]["status"] == "succeeded"
    assert _stored(client, owner, query) == [job_id]


def test_two_apis_racing_a_key_that_refuses_duplicates_store_one_job_and_name_it(
    cluster: Cluster, client: Client
) -> None:
    bases = [cluster.api(), cluster.api()]
    owner, headers = _owner_headers(client)
    _warm(bases, headers, "search-once")
    query = f"crispr-{uuid.uuid4().hex[:6]}"

    answers = _race(bases, headers, {"pipeline": "search-once", "params": {"query": query}})

    [job_id] = _stored(client, owner, query)
    accepted = [answer for answer in answers if answer.status_code == 202]
    refused = [answer for answer in answers if answer.status_code == 409]
    assert len(accepted) == 1 and len(refused) == len(answers) - 1, [a.text for a in answers]
    assert accepted[0].json()["job"]["id"] == str(job_id)
    for answer in refused:
        error = answer.json()["error"]
        assert (error["code"], error["details"]["job_id"]) == ("duplicate_job", str(job_id))
        assert str(job_id) in error["message"]


def _status(client: Client, job_id: uuid.UUID) -> str | None:
    with unit_of_work(client.rt.sessions) as session:
        status: str | None = session.scalar(select(JobRow.status).where(JobRow.id == job_id))
        return status
