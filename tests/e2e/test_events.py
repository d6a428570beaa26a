"""Live event streams from a real API process while real workers run the jobs."""

import contextlib
import json
import os
import signal
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from service.engine.events import events_after
from service.platform.auth import create_api_key
from service.platform.db import unit_of_work
from tests.e2e.conftest import Client, Cluster, wait_for

KEEPALIVE_S = "0.5"


@pytest.fixture
def live(cluster: Cluster) -> str:
    cluster.worker(concurrency=4)
    return cluster.api(event_keepalive_s=KEEPALIVE_S)


def _key(client: Client, owner: str | None = None) -> str:
    with unit_of_work(client.rt.sessions) as session:
        key, _ = create_api_key(
            session, owner=owner or f"ev-{uuid.uuid4().hex[:6]}", scopes=["read", "write"]
        )
    return key


def _auth(key: str, **headers: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **headers}


def _submit(base: str, key: str, hold_s: float = 0.3, **body: Any) -> dict[str, Any]:
    answer = httpx.post(
        f"{base}/v1/jobs",
        json={"pipeline": "slow", "params": {"hold_s": hold_s}, **body},
        headers=_auth(key),
        timeout=90,
    )
    assert answer.status_code in (200, 202), answer.text
    job: dict[str, Any] = answer.json()["job"]
    return job


def _ndjson(
    base: str, key: str, path: str, params: dict[str, str] | None = None
) -> Iterator[dict[str, Any] | None]:
    """The stream's events as they come; ``None`` for each keep-alive."""
    with httpx.stream(
        "GET",
        f"{base}{path}",
        params=params,
        headers=_auth(key, accept="application/x-ndjson"),
        timeout=30,
    ) as answer:
        assert answer.status_code == 200, answer.read()
        assert answer.headers["content-type"].startswith("application/x-ndjson")
        for line in answer.iter_lines():
            yield json.loads(line) if line else None


def _table(client: Client, job_id: str) -> list[tuple[int, str, str | None]]:
    with unit_of_work(client.rt.sessions) as session:
        log = events_after(session, uuid.UUID(job_id), 0)
    return [(e.seq, e.kind, e.step_id) for e in log]


def _as_rows(events: list[dict[str, Any]]) -> list[tuple[int, str, str | None]]:
    return [(e["seq"], e["kind"], e["step_id"]) for e in events]


@pytest.mark.timeout(120)
def test_a_job_stream_replays_then_follows_until_the_job_is_final(
    client: Client, live: str
) -> None:
    key = _key(client)
    job = _submit(live, key, hold_s=2)

    received = list(_ndjson(live, key, f"/v1/jobs/{job['id']}/events"))

    events = [e for e in received if e is not None]
    assert None in received, "keep-alives while the slow step holds"
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert events[-1]["kind"] == "job.succeeded"
    assert _as_rows(events) == _table(client, job["id"])


@pytest.mark.timeout(120)
def test_an_sse_client_resumes_after_its_last_event_and_is_told_when_to_stop(
    client: Client, live: str
) -> None:
    key = _key(client)
    job = _submit(live, key, hold_s=0, mode="sync")
    log = _table(client, job["id"])
    path = f"{live}/v1/jobs/{job['id']}/events"

    answer = httpx.get(
        path, headers=_auth(key, accept="text/event-stream", **{"last-event-id": "3"}), timeout=30
    )

    assert answer.headers["content-type"].startswith("text/event-stream")
    frames = [f for f in answer.text.split("\n\n") if f.strip()]
    ids = [int(f.split("\n")[0].removeprefix("id: ")) for f in frames if f.startswith("id: ")]
    assert ids == [seq for seq, _, _ in log[3:]]
    assert frames[-1].startswith("event: end")
    done = httpx.get(
        path,
        headers=_auth(key, accept="text/event-stream", **{"last-event-id": str(log[-1][0])}),
        timeout=30,
    )
    assert done.status_code == 204


@pytest.mark.timeout(180)
def test_many_open_streams_each_receive_every_event_of_their_jobs(
    client: Client, live: str
) -> None:
    key = _key(client)
    jobs = [_submit(live, key, hold_s=0.2) for _ in range(8)]
    streams = 3
    got: dict[tuple[str, int], list[dict[str, Any]]] = {}
    everything: list[dict[str, Any]] = []
    start = jobs[0]["created_at"]

    def follow(job_id: str, n: int) -> None:
        events = _ndjson(live, key, f"/v1/jobs/{job_id}/events")
        got[(job_id, n)] = [e for e in events if e is not None]

    def follow_all() -> None:
        with contextlib.suppress(httpx.HTTPError):
            for event in _ndjson(live, key, "/v1/events", {"pipeline": "slow", "since": start}):
                if event is not None:
                    everything.append(event)

    threads = [
        threading.Thread(target=follow, args=(job["id"], n), daemon=True)
        for job in jobs
        for n in range(streams)
    ]
    threading.Thread(target=follow_all, daemon=True).start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=150)

    assert len(got) == len(jobs) * streams
    for (job_id, _), events in got.items():
        assert _as_rows(events) == _table(client, job_id)
    ids = {job["id"] for job in jobs}
    expected = sum(len(_table(client, job_id)) for job_id in ids)
    wait_for(
        lambda: len([e for e in everything if e["job_id"] in ids]) >= expected, 30, "all events"
    )
    mine = [e for e in everything if e["job_id"] in ids]
    assert len({(e["job_id"], e["seq"]) for e in mine}) == len(mine) == expected


@pytest.mark.timeout(120)
def test_a_stopping_api_cuts_its_open_streams_after_its_grace_and_exits(
    client: Client, cluster: Cluster
) -> None:
    """A stream never ends by itself; the API told to stop must not wait for it."""
    base = cluster.api(event_keepalive_s=KEEPALIVE_S, api_shutdown_grace_s="1")
    api = cluster.procs[-1]
    key = _key(client)
    opened, ended = threading.Event(), threading.Event()

    def follow() -> None:
        with contextlib.suppress(httpx.HTTPError):
            for _ in _ndjson(base, key, "/v1/events"):
                opened.set()
        ended.set()

    threading.Thread(target=follow, daemon=True).start()
    assert opened.wait(30), "the stream's first keep-alive"

    os.killpg(api.popen.pid, signal.SIGTERM)

    assert api.popen.wait(timeout=30) is not None
    assert ended.wait(10), "the stream was cut"


@pytest.mark.timeout(120)
def test_a_sync_submission_answers_with_the_final_job_or_202_when_it_takes_longer(
    client: Client, live: str
) -> None:
    key = _key(client)

    done = _submit(live, key, hold_s=0, mode="sync", wait_s=60)
    pending = httpx.post(
        f"{live}/v1/jobs",
        json={"pipeline": "slow", "params": {"hold_s": 5}, "mode": "sync", "wait_s": 0.5},
        headers=_auth(key),
        timeout=30,
    )

    assert done["status"] == "succeeded"
    assert done["result"] is not None
    assert pending.status_code == 202
    assert pending.json()["job"]["status"] in ("queued", "running")


@pytest.mark.timeout(60)
def test_another_owners_job_has_no_stream(client: Client, live: str) -> None:
    job = _submit(live, _key(client), hold_s=0)
    stranger = _key(client)

    answer = httpx.get(f"{live}/v1/jobs/{job['id']}/events", headers=_auth(stranger))

    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "job_not_found"
