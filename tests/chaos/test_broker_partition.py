"""The network between a worker and Redis cut, through a TCP proxy, for three leases, while that
worker runs steps that hold longer than a lease, and a second worker, connected to Redis
directly, is there to take over any step whose lease lapses: Redis hands it the cut-off
worker's unacknowledged messages once their visibility timeout (shorter than the cut) is past.

The lease lives in PostgreSQL, which the cut-off worker still reaches, so it keeps renewing its
leases and the second worker, finding them held, waits; were a lease to lapse under a step still
running, the second worker would start the step again while the first goes on. What must hold:
no two executions of a step overlap in time, no step's checkpoint is written twice, every job
succeeds."""

import time
import uuid
from functools import partial

import pytest

from service.platform.constants import BROKER_EPOCH_KEY
from tests.chaos.conftest import ProxiedRedis
from tests.chaos.executions import checkpoints, examine, executions
from tests.chaos.load import finished, first_finish_after, lost_jobs
from tests.chaos.results import record, scaled
from tests.e2e.conftest import FINAL, Client, Cluster, Proc, wait_for
from tests.support.held import held_jobs

CUTS = scaled(ci=1, full=5)
JOBS_PER_CUT = 6
LEASE_S = 3
HOLD_S = 4.0
"""Longer than a lease: a step outlives its first lease while cut off."""
CUT_S = 3 * LEASE_S
VISIBILITY_S = 5
"""Shorter than the cut: the direct worker gets the cut-off worker's messages during it."""
QUICK = {
    "lease_s": str(LEASE_S),
    "sweep_interval_s": "1",
    "visibility_timeout_s": str(VISIBILITY_S),
    "unacked_restore_interval_s": "1",
}


def _running_in(client: Client, jobs: list[uuid.UUID], worker: Proc) -> bool:
    pids = set(worker.children())
    runs = executions(client.counters, jobs).values()
    return any(run.pid in pids and run.end is None for of_step in runs for run in of_step)


@pytest.mark.drill
@pytest.mark.timeout(scaled(ci=180, full=900))
def test_a_worker_cut_off_from_redis_past_the_lease_never_runs_a_step_alongside_another(
    client: Client, cluster: Cluster, redis_proxy: ProxiedRedis
) -> None:
    cluster.beat(**QUICK)
    cut_off = cluster.worker(concurrency=2, broker_url=redis_proxy.url, **QUICK)
    direct = None
    jobs: list[uuid.UUID] = []
    healed = []
    for _ in range(CUTS):
        batch = [client.submit("chaos-chain", hold_s=HOLD_S) for _ in range(JOBS_PER_CUT)]
        jobs += batch
        wait_for(
            partial(_running_in, client, batch, cut_off),
            30,
            "a step running on the worker to be cut off",
        )
        redis_proxy.proxy.cut()
        cut_at = time.monotonic()
        if direct is None:
            direct = cluster.worker(concurrency=2, **QUICK)
        time.sleep(max(0.0, CUT_S - (time.monotonic() - cut_at)))
        redis_proxy.proxy.heal()
        healed.append(time.time())

    def settled() -> bool:
        return all(s in FINAL for s, _ in finished(client, jobs).values())

    deadline = time.monotonic() + scaled(ci=120, full=600)
    while not settled() and time.monotonic() < deadline:
        time.sleep(0.2)
    done = finished(client, jobs)
    lost = lost_jobs(jobs, done)
    runs = executions(client.counters, jobs)
    findings = examine(runs, checkpoints(client, jobs), killed={})
    record(
        "workers cut off from Redis longer than the lease",
        f"{CUTS} cut(s) of {CUT_S} s (lease {LEASE_S} s, steps holding {HOLD_S:.0f} s, "
        "a second worker on Redis directly)",
        len(jobs),
        len(lost),
        findings.doubled,
        first_finish_after(done, healed),
        findings.reruns,
    )
    assert not lost, f"{len(lost)} jobs did not succeed"
    findings.assert_exactly_once()


SILENT_CUTS = scaled(ci=1, full=5)
SILENT_JOBS_PER_CUT = 10
SILENT_CUT_S = 12
SILENT = {
    "lease_s": str(LEASE_S),
    "sweep_interval_s": "1",
    "stall_after_s": "300",
    "visibility_timeout_s": "300",
    "unacked_restore_interval_s": "10",
    "worker_prefetch": "4",
    "worker_disable_prefetch": "false",
    "worker_heartbeat_s": "1",
    "worker_dead_after_s": "4",
}
"""A cut longer than the worker's silence may last: its peer takes it for dead."""


@pytest.mark.drill
@pytest.mark.timeout(scaled(ci=180, full=900))
def test_a_worker_cut_off_past_its_silence_gives_back_what_it_held_and_nothing_runs_twice(
    client: Client, cluster: Cluster, redis_proxy: ProxiedRedis
) -> None:
    """The peer sends the cut-off worker's messages back to the queue and runs them; the
    cut-off worker, which still reaches PostgreSQL, may run its own copies of them meanwhile
    or once healed: each step still settles once. The peer runs only while the network is
    cut, so that the cut-off worker, once back, takes the next batch."""
    client.broker.set(BROKER_EPOCH_KEY, "seen", nx=True)
    cluster.beat(**SILENT)
    cut_off = cluster.worker(concurrency=2, broker_url=redis_proxy.url, **SILENT)
    jobs: list[uuid.UUID] = []
    recovery: list[float] = []
    for _ in range(SILENT_CUTS):
        batch = [client.submit("chaos-chain", hold_s=0.5) for _ in range(SILENT_JOBS_PER_CUT)]
        jobs += batch
        held = wait_for(
            partial(_holding, client, cut_off, 4),
            60,
            "the worker to be cut off, once connected again, to hold four jobs",
        )
        redis_proxy.proxy.cut()
        cut_at = time.time()
        direct = cluster.worker(concurrency=2, **SILENT)
        wait_for(partial(_finished, client, held), SILENT_CUT_S + 10, "its held jobs to finish")
        recovery.append(_finished(client, held) - cut_at)
        time.sleep(max(0.0, SILENT_CUT_S - (time.time() - cut_at)))
        redis_proxy.proxy.heal()
        wait_for(partial(_finished, client, batch), 60, "the cut's jobs to finish")
        direct.stop()

    wait_for(
        lambda: all(s in FINAL for s, _ in finished(client, jobs).values()),
        scaled(ci=120, full=600),
        "every job to finish",
    )
    lost = lost_jobs(jobs, finished(client, jobs))
    findings = examine(executions(client.counters, jobs), checkpoints(client, jobs), killed={})
    record(
        "workers cut off from Redis longer than their silence may last",
        f"{SILENT_CUTS} cut(s) of {SILENT_CUT_S} s (a worker silent for 4 s is taken for dead, "
        "visibility timeout 300 s, a second worker on Redis directly); recovery: cut to the "
        "last job the cut-off worker held finishing",
        len(jobs),
        len(lost),
        findings.doubled,
        recovery,
        findings.reruns,
    )
    assert not lost, f"{len(lost)} jobs did not succeed"
    findings.assert_exactly_once()


def _holding(client: Client, worker: Proc, at_least: int) -> list[uuid.UUID] | None:
    jobs = held_jobs(client.broker, worker.popen.pid)
    return sorted(jobs) if len(jobs) >= at_least else None


def _finished(client: Client, jobs: list[uuid.UUID]) -> float:
    """When the last of ``jobs`` finished, or 0 while one is still open."""
    ends = [client.view(job).job.finished_at for job in jobs]
    return 0.0 if None in ends else max(float(end.timestamp()) for end in ends)
