"""Durable waits on real processes: a waiting job holds no worker slot, and the beat leader
wakes it on time through a worker SIGKILL, a beat leader kill and a Redis flush."""

import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest

from tests.e2e.conftest import Client, Cluster, wait_for
from tests.e2e.test_beat_drill import _leader

WAIT_S = 8
TICK_S = 1.5
"""How far from its time the step after a wait may start: the leader reads due sleepers at
least every second (``LEADER_POLL_S``), and the claim of the next step takes a moment."""
LOCK_TTL_S = "3"


def pausing() -> dict[str, Any]:
    return {
        "name": "pausing",
        "steps": [
            {"id": "first", "action": "drill.count", "with": {"name": "first"}},
            {
                "id": "pause",
                "action": "wait",
                "with": {"seconds": WAIT_S},
                "depends_on": ["first"],
            },
            {
                "id": "after",
                "action": "drill.count",
                "with": {"name": "after", "value": "${{ steps.pause.output.waited_s }}"},
                "depends_on": ["pause"],
            },
        ],
    }


QUICK = {
    "name": "quick",
    "steps": [{"id": "work", "action": "drill.count", "with": {"name": "work", "hold_s": 0.5}}],
}


def asleep(client: Client, job_id: uuid.UUID) -> datetime:
    """When the wait step of the job began, once it sleeps."""
    step = wait_for(
        lambda: (s := client.steps(job_id)["pause"]).status == "sleeping" and s,
        20,
        "the wait step to sleep",
    )
    began: datetime = step.started_at
    return began


def woke_on_time(client: Client, job_id: uuid.UUID, began: datetime) -> None:
    done = client.wait_final(job_id, timeout_s=WAIT_S + 20)
    assert done.job.status == "succeeded", done.job.error
    steps = {s.step_id: s for s in done.steps}
    late = (steps["after"].started_at - began).total_seconds()
    assert abs(late - WAIT_S) <= TICK_S, f"the step after the wait started {late:.2f}s after it"
    assert client.count(job_id, "first") == 1 and client.count(job_id, "after") == 1
    assert client.checkpoints(job_id, "pause") == 1
    assert done.job.result["after"]["value"] >= WAIT_S


@pytest.mark.drill
@pytest.mark.timeout(60)
def test_a_waiting_job_holds_no_worker_and_wakes_on_time_through_a_worker_kill(
    client: Client, cluster: Cluster
) -> None:
    worker = cluster.worker(concurrency=1)
    cluster.beat(beat_lock_ttl_s=LOCK_TTL_S)
    waiting = client.submit(pausing())
    began = asleep(client, waiting)

    other = client.submit(QUICK)
    done = client.wait_final(other, timeout_s=WAIT_S)

    assert done.job.status == "succeeded"
    assert done.job.finished_at < began + timedelta(seconds=WAIT_S / 2), "the wait held the slot"
    assert client.steps(waiting)["pause"].status == "sleeping"
    worker.kill_whole()
    cluster.worker(concurrency=1)
    woke_on_time(client, waiting, began)


@pytest.mark.drill
@pytest.mark.timeout(60)
def test_a_wait_survives_a_beat_leader_kill_and_a_redis_flush(
    client: Client, cluster: Cluster
) -> None:
    cluster.worker(concurrency=1)
    beats = [cluster.beat(beat_lock_ttl_s=LOCK_TTL_S) for _ in range(2)]
    leader = wait_for(lambda: _leader(client.broker, beats), 10, "a leader")
    waiting = client.submit(pausing())
    began = asleep(client, waiting)

    leader.kill_whole()
    client.broker.flushdb()

    standby = wait_for(lambda: _leader(client.broker, beats), 5, "the standby to lead")
    assert standby is not leader
    woke_on_time(client, waiting, began)
