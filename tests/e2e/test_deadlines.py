"""Job deadlines on real processes: the elected beat replica fails a job still running at its
deadline as job_timeout, the worker's running step stops and frees its slot, the step after it
never starts and the saga's compensation runs; also when the beat leader is SIGKILLed before
the deadline and a standby replica takes over."""

import uuid
from datetime import timedelta
from typing import Any

import pytest

from tests.e2e.conftest import Client, Cluster, Proc, wait_for
from tests.e2e.test_beat_drill import _leader

TIMEOUT_S = 3
FAST_BEAT = {"beat_lock_ttl_s": "1.5"}
DRILL_LOCK_TTL_S = 3


def _booking() -> dict[str, Any]:
    """book (undone by unbook) -> long (a minute, far past the deadline) -> after."""
    return {
        "name": "deadline-drill",
        "timeout_s": TIMEOUT_S,
        "steps": [
            {
                "id": "book",
                "action": "drill.count",
                "with": {"name": "book"},
                "compensate": {"action": "drill.undo", "with": {"name": "unbook"}},
            },
            {
                "id": "long",
                "action": "drill.count",
                "depends_on": ["book"],
                "with": {"name": "long", "hold_s": 60},
                "timeout_s": 120,
            },
            {
                "id": "after",
                "action": "drill.count",
                "depends_on": ["long"],
                "with": {"name": "after"},
            },
        ],
    }


def _quick() -> dict[str, Any]:
    return {"name": "quick", "steps": [{"id": "x", "action": "drill.count", "with": {"name": "x"}}]}


def _check_timed_out(client: Client, job_id: uuid.UUID, late_by_s: float) -> None:
    """Failed as job_timeout no later than ``late_by_s`` after its deadline; the long step
    stopped for good, the one after it never started, and book was undone once: on a worker
    of concurrency 1, which the long step would have held for a minute had it not stopped."""
    done = client.wait_final(job_id, timeout_s=TIMEOUT_S + late_by_s + 5)
    job = done.job
    assert job.status == "failed", job.error
    assert job.error["code"] == "job_timeout", job.error
    assert job.deadline_at == job.created_at + timedelta(seconds=TIMEOUT_S)
    assert job.finished_at - job.deadline_at <= timedelta(seconds=late_by_s)
    assert {s.step_id: s.status for s in done.steps} == {
        "book": "succeeded",
        "long": "cancelled",
        "after": "cancelled",
    }
    wait_for(lambda: client.count(job_id, "unbook") == 1, 20, "book's compensation")
    assert client.count(job_id, "long", "started") == 1
    assert client.count(job_id, "long") == 0, "the long step ran to its end"
    assert client.count(job_id, "after", "started") == 0
    assert client.checkpoints(job_id, "long") == 0


@pytest.mark.timeout(90)
def test_a_job_past_its_deadline_fails_its_long_step_stops_and_its_saga_compensates(
    cluster: Cluster, client: Client
) -> None:
    worker = cluster.worker(concurrency=1)
    cluster.beat(**FAST_BEAT)

    job_id = client.submit(_booking())
    wait_for(lambda: client.count(job_id, "long", "started") == 1, 20, "the long step to start")

    _check_timed_out(client, job_id, late_by_s=3)
    quick = client.submit(_quick())
    assert client.wait_final(quick, timeout_s=15).job.status == "succeeded", "the slot is free"
    assert client.steps(quick)["x"].attempts == 1
    assert "Terminating" not in worker.output(), "a signal may land in the next job's step"


@pytest.mark.drill
@pytest.mark.timeout(90)
def test_a_deadline_is_enforced_by_the_standby_when_the_beat_leader_is_killed_before_it(
    cluster: Cluster, client: Client
) -> None:
    cluster.worker(concurrency=1)
    beats: list[Proc] = [cluster.beat(beat_lock_ttl_s=str(DRILL_LOCK_TTL_S)) for _ in range(2)]
    leader = wait_for(lambda: _leader(client.broker, beats), 15, "a leader")

    job_id = client.submit(_booking())
    leader.kill()
    wait_for(lambda: client.count(job_id, "long", "started") == 1, 20, "the long step to start")

    _check_timed_out(client, job_id, late_by_s=2 * DRILL_LOCK_TTL_S + 2)
    assert _leader(client.broker, beats) not in (None, leader), "the standby leads"
