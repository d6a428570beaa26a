"""A broker on Redis Sentinel carries what the failover drill does not exercise: a fan-out and
its join (Celery's chord, on the Sentinel result backend), the worker's liveness beats and
the beat's leader lock, all on the primary the sentinels name. Starts a primary, a replica,
three sentinels, an API, a worker and a beat."""

import uuid
from pathlib import Path

import httpx

from service.platform.brokers import BrokerAddress, redis_client
from service.platform.constants import BEAT_LOCK_KEY, WORKERS_KEY
from tests.chaos.load import write_key
from tests.e2e.conftest import Client, Cluster, wait_for
from tests.support.sentinel import MASTER, sentinel_group


def test_a_fan_out_liveness_and_the_beat_lock_live_on_the_sentinels_primary(
    client: Client, cluster: Cluster, tmp_path: Path
) -> None:
    cluster.env["DRILL_REDIS_URL"] = cluster.stack.broker_url.rsplit("/", 1)[0] + "/0"
    with sentinel_group(tmp_path) as group:
        settings = {"broker_url": group.url, "broker_sentinel_master": MASTER}
        base = cluster.api(**settings)
        cluster.worker(concurrency=2, **settings)
        cluster.beat(**settings)
        answer = httpx.post(
            f"{base}/v1/jobs",
            json={"pipeline": "chaos-fan", "params": {"items": [0, 1, 2], "hold_s": 0.05}},
            headers={"Authorization": f"Bearer {write_key(client)}"},
            timeout=10,
        )
        assert answer.status_code == 202, answer.text
        view = client.wait_final(uuid.UUID(answer.json()["job"]["id"]), 60)
        assert view.job.status == "succeeded"
        primary = redis_client(BrokerAddress(group.url, MASTER), socket_timeout=2)
        try:
            wait_for(lambda: primary.get(BEAT_LOCK_KEY), 10, "the beat to hold its lock")
            assert primary.zcard(WORKERS_KEY) == 1
        finally:
            primary.close()
        cluster.close()
