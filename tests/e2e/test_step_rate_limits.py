"""Step rate limits on real processes: a key's steps, run by three workers for two owners,
never start more than the limit in any window of the key, measured from the steps' own start
times; those that found no room park holding no worker, so a plain job passes them; a Redis
flush loses no parked step, and a worker killed while its step holds units leaks none."""

import time
import uuid
from typing import Any

import pytest

from service.platform.states import StepStatus
from tests.e2e.conftest import Client, Cluster, wait_for

STEPS = 60
LIMIT = 5
PER_S = 1


def limited(key: str, limit: int = LIMIT, hold_s: float = 0.0) -> dict[str, Any]:
    step: dict[str, Any] = {
        "id": "call",
        "action": "drill.stamp",
        "with": {"name": key, "hold_s": hold_s},
        "rate_limit": {"key": "${{ params.source }}", "limit": limit, "per_s": PER_S},
    }
    return {"name": "limited", "params": {"source": {"type": "string"}}, "steps": [step]}


PLAIN = {"name": "plain", "steps": [{"id": "work", "action": "drill.count", "with": {"name": "w"}}]}


def starts(client: Client, key: str) -> list[float]:
    return sorted(float(raw) for raw in client.counters.lrange(f"drill:stamps:{key}", 0, -1))


def most_in_a_window(times: list[float], window_s: float) -> int:
    """The most start times any window of ``window_s`` seconds holds: each window worth
    looking at begins at a start."""
    return max(sum(1 for t in times[i:] if t < first + window_s) for i, first in enumerate(times))


def submit_burst(client: Client, key: str, count: int, **shape: Any) -> list[uuid.UUID]:
    owners = ("lab-a", "lab-b")
    return [
        client.submit_at(None, limited(key, **shape), owner=owners[n % 2], source=key)
        for n in range(count)
    ]


def all_succeed(client: Client, jobs: list[uuid.UUID], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for job_id in jobs:
        done = client.wait_final(job_id, timeout_s=max(1.0, deadline - time.monotonic()))
        assert done.job.status == "succeeded", done.job.error


@pytest.mark.timeout(120)
def test_sixty_steps_of_a_key_at_five_a_second_never_start_six_in_a_second(
    client: Client, cluster: Cluster
) -> None:
    for _ in range(3):
        cluster.worker(concurrency=2)
    cluster.beat()
    key = f"europepmc-{uuid.uuid4().hex[:8]}"
    jobs = submit_burst(client, key, STEPS)
    wait_for(
        lambda: any(client.steps(j)["call"].status == StepStatus.AWAITING_RATE for j in jobs),
        20,
        "a step to park for the rate",
    )

    plain = client.submit(PLAIN)
    quick = client.wait_final(plain, timeout_s=10)

    all_succeed(client, jobs, timeout_s=60)
    times = starts(client, key)
    assert len(times) == STEPS
    assert most_in_a_window(times, PER_S) <= LIMIT
    ideal_s = (STEPS / LIMIT - 1) * PER_S
    assert ideal_s <= times[-1] - times[0] < 1.6 * ideal_s, "the steps wasted the key's limit"
    assert quick.job.status == "succeeded"
    waited = (quick.job.finished_at - quick.job.created_at).total_seconds()
    assert waited < 3, f"the plain job took {waited:.1f}s behind the parked steps"
    assert quick.job.finished_at.timestamp() < times[-1], "the plain job waited for the burst"


@pytest.mark.timeout(90)
def test_a_redis_flush_loses_no_parked_step(client: Client, cluster: Cluster) -> None:
    cluster.worker(concurrency=2)
    cluster.beat()
    key = f"lims-{uuid.uuid4().hex[:8]}"
    jobs = submit_burst(client, key, 20, limit=2)
    wait_for(
        lambda: sum(client.steps(j)["call"].status == StepStatus.AWAITING_RATE for j in jobs) > 10,
        20,
        "steps to park for the rate",
    )

    client.broker.flushdb()

    all_succeed(client, jobs, timeout_s=60)
    assert len(starts(client, key)) == 20


@pytest.mark.drill
@pytest.mark.timeout(90)
def test_a_worker_killed_while_its_step_holds_units_leaks_none(
    client: Client, cluster: Cluster
) -> None:
    doomed = cluster.worker(concurrency=1)
    cluster.beat()
    key = f"gpu-{uuid.uuid4().hex[:8]}"
    holder = client.submit_at(None, limited(key, limit=1, hold_s=60), source=key)
    wait_for(lambda: len(starts(client, key)) == 1, 20, "the first step to start")
    doomed.kill_whole()
    killed_at = time.time()

    cluster.worker(concurrency=1)
    after = client.submit_at(None, limited(key, limit=1), source=key)

    assert client.wait_final(after, timeout_s=30).job.status == "succeeded"
    first, second = starts(client, key)[:2]
    assert second - first >= PER_S
    assert second - killed_at < PER_S + 5, "the killed step's unit outlived its window"
    assert client.view(holder).job.status == "running"
