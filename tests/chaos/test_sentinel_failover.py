"""The broker on Redis Sentinel: its primary SIGKILLed under load, the sentinels promote the
replica, and every job the API accepted succeeds.

An API, two workers and a beat run on a ``sentinel://`` URL of a primary, a replica and three
sentinels of the test's own. Replication is asynchronous, so the promoted replica may lack the
last writes the primary took: a pushed message, an acknowledgement, a liveness beat. The
sweeper finds a job whose message is nowhere (neither queued nor held) and sends it again; a
message a lost acknowledgement brings back finds its step checkpointed (in PostgreSQL, which
the failover does not touch) and does not run it again. The recovery column is from the kill
to the first step started after the promotion, which only a message from the new primary
can start.

At full scale the killed primary comes back empty as the new primary's replica before the
next kill, so each failover has a replica to promote. The drill actions record every
execution in the stack's own Redis, which no failover touches."""

import random
import time
from pathlib import Path

import pytest

from tests.chaos.executions import Execution, checkpoints, examine, executions
from tests.chaos.load import Poster, await_settled, lost_jobs, write_key
from tests.chaos.results import record, scaled
from tests.e2e.conftest import Client, Cluster
from tests.support.sentinel import MASTER, SentinelGroup, sentinel_group

FAILOVERS = scaled(ci=1, full=10)
WORKERS = 2
PROMOTION_BOUND_S = 30
QUICK = {"sweep_interval_s": "1", "lease_s": "4", "dispatch_grace_s": "2", "stall_after_s": "15"}


def _back_after(
    runs: dict[str, list[Execution]], failovers: list[tuple[float, float]]
) -> list[float]:
    """For each failover, from the kill to the first step started after the promotion: a
    worker can only start one on a message from the new primary. (The end of a job accepted
    after the kill measures the backlog as much: the load outruns two workers.)"""
    starts = sorted(run.start for key_runs in runs.values() for run in key_runs)
    return [min(t for t in starts if t > promoted) - killed for killed, promoted in failovers]


def _fail_over(group: SentinelGroup, rng: random.Random) -> tuple[float, float]:
    """Load for a while, then the primary killed; the moments of the kill and the promotion."""
    time.sleep(rng.uniform(2.0, 4.0))
    killed = group.kill_primary()
    return killed, group.await_failover(PROMOTION_BOUND_S)


@pytest.mark.drill
@pytest.mark.timeout(scaled(ci=150, full=1200))
def test_a_sentinel_failover_under_load_loses_no_accepted_job(
    client: Client, cluster: Cluster, tmp_path: Path
) -> None:
    rng = random.Random(31)
    cluster.env["DRILL_REDIS_URL"] = cluster.stack.broker_url.rsplit("/", 1)[0] + "/0"
    with sentinel_group(tmp_path) as group:
        settings = {"broker_url": group.url, "broker_sentinel_master": MASTER, **QUICK}
        base = cluster.api(**settings)
        procs = [cluster.beat(**settings)]
        procs += [cluster.worker(concurrency=2, **settings) for _ in range(WORKERS)]
        failovers: list[tuple[float, float]] = []
        with Poster(base, write_key(client)) as poster:
            for n in range(FAILOVERS):
                if n:
                    group.revive()
                failovers.append(_fail_over(group, rng))
            time.sleep(3.0)
        accepted = poster.accepted
        done = await_settled(client, accepted, scaled(ci=60, full=600), procs)
        cluster.close()
    lost = lost_jobs(accepted, done)
    runs = executions(client.counters, accepted)
    findings = examine(runs, checkpoints(client, accepted), killed={})
    recovery = _back_after(runs, failovers)
    promotion = [promoted - killed for killed, promoted in failovers]
    record(
        "Redis Sentinel primary SIGKILLed under load",
        f"{FAILOVERS} failovers (promoted in {max(promotion):.1f} s at most), "
        f"{len(poster.refused)} POSTs refused meanwhile",
        len(accepted),
        len(lost),
        findings.doubled,
        recovery,
        findings.reruns,
    )
    print(
        f"sentinel failover: {len(accepted)} jobs, {len(lost)} lost, {findings.doubled} doubled, "
        f"{findings.reruns} re-runs, promoted after {promotion} s, "
        f"the first step started {recovery} s after the kill"
    )
    assert accepted and not lost, f"{len(lost)} accepted jobs did not succeed"
    findings.assert_exactly_once()
    assert len(recovery) == FAILOVERS
    assert set(poster.refused) <= {"0", "503 broker_unavailable"}, poster.refused
