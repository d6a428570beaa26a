"""A worker's connections to Redis stranded mid-job, through a TCP proxy: every byte on them is
dropped from then on, while new connections flow, as when a NAT or firewall forgets its
connections or Redis fails over to another address. No error reaches the worker; only a
timeout can tell it that a socket is dead.

The worker is the only one, so the jobs finish only if it notices on its own, whatever it
was waiting on when its connections went quiet (the broker's BRPOP, an ack, a fan-out's
publish, the result backend), and connects again. What must hold: every job succeeds within a
bound set by the timeouts, no two executions of a step overlap, no checkpoint is written
twice."""

import time
import uuid
from functools import partial

import pytest

from tests.chaos.conftest import ProxiedRedis
from tests.chaos.executions import checkpoints, examine, executions
from tests.chaos.load import Finished, finished, lost_jobs
from tests.chaos.results import record, scaled
from tests.e2e.conftest import FINAL, Client, Cluster, wait_for

STRANDINGS = scaled(ci=1, full=5)
JOBS_PER_STRANDING = 4
LEASE_S = 3
QUICK = {"lease_s": str(LEASE_S), "sweep_interval_s": "1", "unacked_restore_interval_s": "1"}
RECOVERY_BOUND_S = 40.0
"""From the stranding to the batch's last job done: kombu drops a BRPOP whose reply is overdue
by its health-check interval (5 s) past the 1 s BRPOP, checking every 5 s (11 s at most); any
other command gives up after the socket timeout (5 s); a fan-out item whose bookkeeping in the
result backend timed out is sent again by the sweeper once its lease lapsed (3 s here); and
the batch's own work takes a few seconds on two pool processes. Five strandings took 23 s
each on a quiet machine; before the timeouts, the jobs were still waiting after 75 s."""


def _started(client: Client, jobs: list[uuid.UUID]) -> bool:
    runs = executions(client.counters, jobs).values()
    return any(run for of_step in runs for run in of_step)


@pytest.mark.drill
@pytest.mark.timeout(scaled(ci=240, full=900))
def test_a_worker_whose_redis_connections_go_silent_reconnects_and_finishes_every_job(
    client: Client, cluster: Cluster, redis_proxy: ProxiedRedis
) -> None:
    cluster.beat(**QUICK)
    cluster.worker(concurrency=2, broker_url=redis_proxy.url, **QUICK)
    jobs: list[uuid.UUID] = []
    batches: list[tuple[float, list[uuid.UUID]]] = []
    for _ in range(STRANDINGS):
        batch = [client.submit("chaos-chain", hold_s=0.5) for _ in range(JOBS_PER_STRANDING)]
        batch += [client.submit("chaos-fan", items=[1, 2, 3, 4, 5, 6], hold_s=0.3)]
        jobs += batch
        wait_for(partial(_started, client, batch), 30, "a step of the batch to start")
        redis_proxy.proxy.strand()
        batches.append((time.time(), batch))
        batch_done = time.monotonic() + RECOVERY_BOUND_S + 30
        while time.monotonic() < batch_done:
            if all(s in FINAL for s, _ in finished(client, batch).values()):
                break
            time.sleep(0.2)
    done = finished(client, jobs)
    lost = lost_jobs(jobs, done)
    runs = executions(client.counters, jobs)
    findings = examine(runs, checkpoints(client, jobs), killed={})
    recovery = [_last_finish(done, batch) - at for at, batch in batches]
    record(
        "a worker's Redis connections stranded (half-open)",
        f"{STRANDINGS} stranding(s) of every open connection, mid-job; new connections flow",
        len(jobs),
        len(lost),
        findings.doubled,
        recovery,
        findings.reruns,
    )
    assert not lost, f"{len(lost)} jobs did not succeed"
    findings.assert_exactly_once()
    assert max(recovery) < RECOVERY_BOUND_S, recovery


def _last_finish(done: Finished, batch: list[uuid.UUID]) -> float:
    return max((done[job][1] or float("inf")) for job in batch)
