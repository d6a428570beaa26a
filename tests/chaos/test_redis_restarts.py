"""A Redis server of their own, SIGKILLed and started again empty (no persistence) again and
again while jobs are POSTed to the API: every job the API accepted succeeds.

The broker's messages, the beat lock and the chord counters vanish with each restart; the
sweeper notices the empty broker (its epoch key is gone) and sends every open job again, and
a step that was running meanwhile finishes under its lease. A POST that meets the outage is
refused with 503 and is not counted as accepted."""

import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.executions import checkpoints, examine, executions
from tests.chaos.load import Poster, await_settled, first_finish_after, lost_jobs, write_key
from tests.chaos.results import record, scaled
from tests.e2e.conftest import Client, Cluster
from tests.support.redis_server import RedisServer

RESTARTS = scaled(ci=3, full=20)
RATE_PER_S = 8
QUICK = {"sweep_interval_s": "1", "lease_s": "4", "dispatch_grace_s": "2", "stall_after_s": "15"}


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    yield server
    server.stop()


@pytest.mark.drill
@pytest.mark.timeout(scaled(ci=180, full=1800))
def test_redis_restarted_empty_under_load_loses_no_accepted_job(
    client: Client, cluster: Cluster, private_redis: RedisServer
) -> None:
    rng = random.Random(11)
    cluster.env["DRILL_REDIS_URL"] = cluster.stack.broker_url.rsplit("/", 1)[0] + "/0"
    settings = {"broker_url": f"redis://127.0.0.1:{private_redis.port}/0", **QUICK}
    base = cluster.api(**settings)
    beat = cluster.beat(**settings)
    worker = cluster.worker(concurrency=2, **settings)
    restarts = []
    with Poster(base, write_key(client)) as poster:
        for _ in range(RESTARTS):
            time.sleep(rng.uniform(2.0, 4.0))
            restarts.append(private_redis.restart())
        time.sleep(2.0)
    accepted = poster.accepted
    done = await_settled(client, accepted, scaled(ci=90, full=600), [worker, beat])
    lost = lost_jobs(accepted, done)
    findings = examine(
        executions(client.counters, accepted), checkpoints(client, accepted), killed={}
    )
    recovery = first_finish_after(done, restarts)
    record(
        "Redis SIGKILLed and restarted empty under load",
        f"{RESTARTS} restarts, {len(poster.refused)} POSTs refused meanwhile",
        len(accepted),
        len(lost),
        findings.doubled,
        recovery,
        findings.reruns,
    )
    assert accepted and not lost, f"{len(lost)} accepted jobs did not succeed"
    findings.assert_exactly_once()
    assert len(recovery) == RESTARTS
    assert set(poster.refused) <= {"0", "503 broker_unavailable"}, poster.refused
