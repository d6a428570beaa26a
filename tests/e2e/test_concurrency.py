"""Concurrency keys on real workers and beat: never more jobs of a key open at once than its
limit, the others let in as slots free (the most urgent first), and a worker killed under a slot
leaks none."""

import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import httpx

from service.platform.auth import create_api_key
from service.platform.db import unit_of_work
from tests.e2e.conftest import Client, Cluster, wait_for
from tests.support.overtaking import post_backlog_then_urgent, started_before

LIMIT = 2
HOLD_S = 1.0


def _keyed(hold_s: float = HOLD_S, limit: int = LIMIT, queue: str = "default") -> dict[str, Any]:
    return {
        "name": f"keyed-{uuid.uuid4().hex[:6]}",
        "queue": queue,
        "params": {"tenant": {"type": "string"}},
        "concurrency": {"key": "${{ params.tenant }}", "limit": limit},
        "steps": [
            {"id": "call", "action": "drill.count", "with": {"name": "call", "hold_s": hold_s}}
        ],
    }


def _most_at_once(spans: list[tuple[datetime, datetime]]) -> int:
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = most = 0
    for _, change in edges:
        running += change
        most = max(most, running)
    return most


def _spans(client: Client, jobs: list[uuid.UUID]) -> list[tuple[datetime, datetime]]:
    spans = []
    for job in jobs:
        step = client.steps(job)["call"]
        assert step.started_at is not None and step.finished_at is not None
        spans.append((step.started_at, step.finished_at))
    return spans


def test_a_key_never_has_more_jobs_running_than_its_limit(client: Client, cluster: Cluster) -> None:
    cluster.worker(concurrency=3)
    cluster.worker(concurrency=3)
    cluster.beat()
    profile = _keyed()
    acme = [client.submit(profile, tenant="acme") for _ in range(6)]
    other = client.submit(profile, tenant="globex")

    waiting = [job for job in acme if client.view(job).job.waiting_for == "concurrency"]
    assert len(waiting) == len(acme) - LIMIT
    for job in [*acme, other]:
        assert client.wait_final(job, timeout_s=60).job.status == "succeeded"

    assert _most_at_once(_spans(client, acme)) == LIMIT
    assert all(client.count(job, "call") == 1 for job in acme)


def test_a_priority_9_job_waiting_on_its_key_passes_the_jobs_waiting_before_it(
    client: Client, cluster: Cluster
) -> None:
    """Posted while no worker runs, with fair share on as an operator runs it (a keyed job
    waits for its slot, not its turn): the first job takes the one slot, the others wait on
    the key, and each slot freed goes to the most urgent of them."""
    ahead = {"fair_share_ahead": "4"}
    base = cluster.api(**ahead)
    cluster.beat(**ahead)
    low, urgent = post_backlog_then_urgent(client, base, _keyed(hold_s=0.3, limit=1), tenant="a")
    assert client.view(urgent).job.waiting_for == "concurrency"

    cluster.worker(concurrency=1, **ahead)

    passed = started_before(client, low, urgent, "call")
    assert len(passed) <= 2, f"{len(passed)} of {len(low)} low-priority jobs started first"
    assert _most_at_once(_spans(client, [*low, urgent])) == 1


def test_a_worker_of_another_queue_killed_holding_a_slot_leaks_it_not(
    client: Client, cluster: Cluster
) -> None:
    fast_recovery = {
        "worker_heartbeat_s": "0.5",
        "worker_dead_after_s": "2",
        "lease_s": "3",
        "sweep_interval_s": "1",
        "dispatch_grace_s": "1",
    }
    pool = {**fast_recovery, "worker_queues": "pool"}
    cluster.worker(concurrency=1, **fast_recovery)
    doomed = cluster.worker(concurrency=1, **pool)
    cluster.beat(**fast_recovery)
    profile = _keyed(hold_s=4.0, limit=1, queue="pool")
    jobs = [client.submit(profile, tenant="acme") for _ in range(3)]
    wait_for(lambda: client.count(jobs[0], "call", "started"), 30, "the first job to run")

    doomed.kill_whole()
    cluster.worker(concurrency=2, **pool)

    for job in jobs:
        assert client.wait_final(job, timeout_s=90).job.status == "succeeded"
    spans = _spans(client, jobs)
    assert _most_at_once(spans) == 1, "the slot went to a second job while the first held it"
    assert client.count(jobs[1], "call") == 1 and client.count(jobs[2], "call") == 1


def test_jobs_waiting_on_a_key_start_in_turn_through_a_redis_flush(
    client: Client, cluster: Cluster
) -> None:
    """The waiting jobs live in PostgreSQL alone: a broker flushed under them loses none, and
    the holder's end still lets the next one in. The holder's own message goes with the flush,
    so it may run again (at least once), never beside the next."""
    cluster.worker(concurrency=2)
    cluster.beat()
    profile = _keyed(hold_s=2.0, limit=1)
    jobs = [client.submit(profile, tenant="acme") for _ in range(3)]
    wait_for(lambda: client.count(jobs[0], "call", "started"), 30, "the first job to run")
    assert [client.view(job).job.waiting_for for job in jobs[1:]] == ["concurrency"] * 2

    client.broker.flushdb()

    for job in jobs:
        assert client.wait_final(job, timeout_s=60).job.status == "succeeded"
    assert _most_at_once(_spans(client, jobs)) == 1
    assert all(client.count(job, "call") == 1 for job in jobs[1:]), "each waiting job ran once"


def test_a_step_key_never_has_more_steps_running_than_its_limit_across_jobs(
    client: Client, cluster: Cluster
) -> None:
    """No process dies here, so the steps run under a production-length lease: under the test
    stack's 3 s one, a step starved of CPU on a busy machine lets its lease lapse, and the
    beat leader rightly hands its slot on while it still runs."""
    held = {"lease_s": "30"}
    cluster.worker(concurrency=3, **held)
    cluster.worker(concurrency=3, **held)
    cluster.beat(**held)
    profile = {
        "name": f"shared-{uuid.uuid4().hex[:6]}",
        "steps": [
            {"id": "prep", "action": "drill.count", "with": {"name": "prep"}},
            {
                "id": "call",
                "action": "drill.count",
                "with": {"name": "call", "hold_s": 0.5},
                "depends_on": ["prep"],
                "concurrency": {"key": f"svc-{uuid.uuid4().hex[:6]}", "limit": 1},
            },
        ],
    }
    jobs = [client.submit(profile) for _ in range(5)]
    for job in jobs:
        assert client.wait_final(job, timeout_s=60).job.status == "succeeded"

    assert _most_at_once(_spans(client, jobs)) == 1
    assert all(client.count(job, "call") == 1 for job in jobs)


def test_two_api_processes_racing_for_the_last_slot_let_in_one_job(
    client: Client, cluster: Cluster
) -> None:
    """No worker runs: every job stays where its submission left it."""
    apis = [cluster.api(), cluster.api()]
    with unit_of_work(client.rt.sessions) as session:
        key, _ = create_api_key(session, owner=f"race-{uuid.uuid4().hex[:6]}", scopes=["write"])
    profile = _keyed(limit=1)

    def post(n: int) -> str:
        answer = httpx.post(
            f"{apis[n % 2]}/v1/jobs",
            json={"pipeline": profile, "params": {"tenant": "acme"}},
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )
        assert answer.status_code == 202, answer.text
        return str(answer.json()["job"]["id"])

    with ThreadPoolExecutor(max_workers=8) as pool:
        jobs = list(pool.map(post, range(16)))

    let_in = [job for job in jobs if client.view(uuid.UUID(job)).job.waiting_for is None]
    assert len(let_in) == 1
