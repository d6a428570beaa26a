"""An API host cut off from everything (the client, PostgreSQL, Redis) while a submission with
an idempotency key is on its way to it or through it: the client's first POST gets no answer,
and its retry with the same key against the other API host gets the one job for that key,
whether the cut-off host had stored it or not.

The cut comes at a different moment after the first POST leaves in each round, to land before,
during and after the host's work on it. A host cut off between its insert and its commit holds
the key's row locked in PostgreSQL until it is healed (PostgreSQL cannot tell a silent peer from
a slow one), so a retry still unanswered after ``PARTITIONED_RETRY_S`` is tried again once the
host is healed; the scenario counts those."""

import threading
import time
import uuid
from dataclasses import dataclass, field

import httpx
import pytest
from sqlalchemy import select

from service.platform.db import unit_of_work
from service.platform.models import JobRow
from tests.chaos.load import await_settled, write_key
from tests.cluster.deployment import Deployment
from tests.cluster.results import record
from tests.e2e.conftest import Client

CUT_AFTER_S = (0.0, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32)
FIRST_TIMEOUT_S = 3.0
PARTITIONED_RETRY_S = 10.0
HEALED_RETRY_S = 60.0


@dataclass
class FirstPost:
    """The client's first POST, to the host about to be cut off, on a thread of its own."""

    url: str
    key: str
    body: dict[str, object]
    answer: list[httpx.Response] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._send, daemon=True)
        self.thread.start()

    def _send(self) -> None:
        headers = {"Authorization": f"Bearer {self.key}"}
        try:
            self.answer.append(
                httpx.post(
                    f"{self.url}/v1/jobs", json=self.body, headers=headers, timeout=FIRST_TIMEOUT_S
                )
            )
        except httpx.HTTPError:
            return


def _retry(url: str, key: str, body: dict[str, object], for_s: float) -> httpx.Response | None:
    """POST until an answer other than a 5xx, for at most ``for_s``."""
    deadline = time.monotonic() + for_s
    headers = {"Authorization": f"Bearer {key}"}
    while time.monotonic() < deadline:
        try:
            answer = httpx.post(
                f"{url}/v1/jobs",
                json=body,
                headers=headers,
                timeout=max(0.5, deadline - time.monotonic()),
            )
        except httpx.HTTPError:
            continue
        if answer.status_code < 500:
            return answer
    return None


def _jobs_of(client: Client, keys: list[str]) -> dict[str, list[tuple[uuid.UUID, str]]]:
    with unit_of_work(client.rt.sessions) as session:
        rows = session.execute(
            select(JobRow.idempotency_key, JobRow.id, JobRow.status).where(
                JobRow.idempotency_key.in_(keys)
            )
        ).all()
    found: dict[str, list[tuple[uuid.UUID, str]]] = {key: [] for key in keys}
    for key, job_id, status in rows:
        found[str(key)].append((job_id, status))
    return found


@pytest.mark.timeout(300)
def test_an_api_host_cut_off_mid_submission_leaves_one_job_per_key(
    hosts: Deployment, reader: Client
) -> None:
    started = time.monotonic()
    key = write_key(reader)
    cut_off, other = hosts.apis
    cut_from = [hosts.net.machine, hosts.pg_address, hosts.redis_address]
    answers: dict[str, uuid.UUID] = {}
    first_answered = waited_for_heal = 0
    recovery: list[float] = []
    for delay in CUT_AFTER_S:
        ikey = f"cluster-{uuid.uuid4()}"
        body: dict[str, object] = {"pipeline": "chaos-chain", "idempotency_key": ikey}
        first = FirstPost(hosts.api_url(cut_off), key, body)
        time.sleep(delay)
        hosts.net.partition(cut_off, cut_from)
        cut_at = time.monotonic()
        first.thread.join(FIRST_TIMEOUT_S + 1)
        answer = _retry(hosts.api_url(other), key, body, PARTITIONED_RETRY_S)
        hosts.net.heal()
        if answer is None:
            waited_for_heal += 1
            answer = _retry(hosts.api_url(other), key, body, HEALED_RETRY_S)
        recovery.append(time.monotonic() - cut_at)
        assert answer is not None and answer.status_code in (200, 202), answer
        answers[ikey] = uuid.UUID(answer.json()["job"]["id"])
        for given in first.answer:
            first_answered += 1
            assert uuid.UUID(given.json()["job"]["id"]) == answers[ikey]
    await_settled(reader, list(answers.values()), 120)
    stored = _jobs_of(reader, list(answers))
    doubled = sum(max(0, len(jobs) - 1) for jobs in stored.values())
    lost = sum(not any(s == "succeeded" for _, s in jobs) for jobs in stored.values())
    record(
        "an API host cut off mid-submission, retried on the other",
        f"api1 cut off from the client, PostgreSQL and Redis 0 to 320 ms after a POST with an "
        f"idempotency key left, {len(CUT_AFTER_S)} times; {first_answered} first POST(s) "
        f"answered before the cut, {waited_for_heal} retry(ies) answered only once healed",
        jobs=len(answers),
        lost=lost,
        doubled=doubled,
        reruns=0,
        recovery_s=recovery,
        started=started,
    )
    assert doubled == 0, f"a key got two jobs: {stored}"
    assert lost == 0
    assert {key: jobs[0][0] for key, jobs in stored.items()} == answers
