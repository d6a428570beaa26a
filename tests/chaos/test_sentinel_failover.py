"""The broker on Redis Sentinel: its primary SIGKILLed under load, the sentinels promote the
replica, and every job the API accepted succeeds.

An API, two workers and a beat run on a ``sentinel://`` URL of a primary, a replica and three
sentinels of the test's own. Replication is asynchronous, so the promoted replica may lack the
last writes the primary took: a pushed message, an acknowledgement, a liveness beat. The
sweeper finds a job whose message is nowhere (neither queued nor held) and sends it again; a
step may then run again after a lost acknowledgement, which the row reports as a re-run.

At full scale the killed primary comes back empty as the new primary's replica before the
next kill, so each failover has a replica to promote. The drill actions record every
execution in the stack's own Redis, which no failover touches."""

import random
import time
import uuid
from pathlib import Path

import pytest

from tests.chaos.executions import checkpoints, examine, executions
from tests.chaos.load import Finished, Poster, await_settled, lost_jobs, write_key
from tests.chaos.results import record, scaled
from tests.e2e.conftest import Client, Cluster
from tests.support.sentinel import MASTER, SentinelGroup, sentinel_group

FAILOVERS = scaled(ci=1, full=10)
WORKERS = 2
PROMOTION_BOUND_S = 30
QUICK = {"sweep_interval_s": "1", "lease_s": "4", "dispatch_grace_s": "2", "stall_after_s": "15"}


def _back_after(client: Client, done: Finished, kills: list[float]) -> list[float]:
    """For each kill, how long until a job accepted after it had finished: the API, the
    workers and the beat all on the new primary, end to end. A job accepted before the kill
    may finish just after it without the broker, which measures nothing."""
    created = _created(client, list(done))
    return [
        min(end for job, (_, end) in done.items() if end is not None and created[job] > kill) - kill
        for kill in kills
    ]


def _created(client: Client, job_ids: list[uuid.UUID]) -> dict[uuid.UUID, float]:
    from sqlalchemy import select

    from service.platform.db import unit_of_work
    from service.platform.models import JobRow

    with unit_of_work(client.rt.sessions) as session:
        rows = session.execute(select(JobRow.id, JobRow.created_at).where(JobRow.id.in_(job_ids)))
        return {job: at.timestamp() for job, at in rows}


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
    findings = examine(
        executions(client.counters, accepted), checkpoints(client, accepted), killed={}
    )
    recovery = _back_after(client, done, [killed for killed, _ in failovers])
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
        f"a job accepted after the kill finished after {recovery} s"
    )
    assert accepted and not lost, f"{len(lost)} accepted jobs did not succeed"
    findings.assert_exactly_once()
    assert len(recovery) == FAILOVERS
    assert set(poster.refused) <= {"0", "503 broker_unavailable"}, poster.refused
