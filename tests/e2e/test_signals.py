"""Signals on real processes: a job parks on a signal holding no worker (another job runs on
the concurrency-1 worker meanwhile), the broker's Redis DB is flushed while it waits, and the
signal sent over the live API sends it on, its downstream step reading the payload; a wait
with no signal in time goes on when the elected beat replica times it out."""

import uuid
from typing import Any

import httpx
import pytest

from flowbeat_client import Client as FlowbeatClient
from flowbeat_client import FlowbeatApiError
from service.platform.auth import create_api_key
from service.platform.db import unit_of_work
from tests.e2e.conftest import Client, Cluster, wait_for


def _paid(timeout_s: int = 600, on_timeout: str = "fail") -> dict[str, Any]:
    """order -> charge (waits for payment) -> ship (reads who paid)."""
    return {
        "name": "signal-drill",
        "steps": [
            {"id": "order", "action": "drill.count", "with": {"name": "order"}},
            {
                "id": "charge",
                "action": "drill.count",
                "depends_on": ["order"],
                "wait_for": {
                    "signal": "payment",
                    "timeout_s": timeout_s,
                    "on_timeout": on_timeout,
                },
                "with": {"name": "charge", "value": "${{ signals.payment.payload.amount }}"},
            },
            {
                "id": "ship",
                "action": "drill.count",
                "depends_on": ["charge"],
                "with": {"name": "ship", "value": "${{ signals.payment.payload.by }}"},
            },
        ],
    }


def _parked(client: Client, job_id: uuid.UUID) -> None:
    wait_for(
        lambda: client.steps(job_id)["charge"].status == "awaiting_signal",
        30,
        "the step to park on its signal",
    )


def test_a_job_waits_for_its_signal_without_a_worker_through_a_redis_flush(
    client: Client, cluster: Cluster
) -> None:
    cluster.worker(concurrency=1)
    base = cluster.api()
    with unit_of_work(client.rt.sessions) as session:
        key, _ = create_api_key(session, owner="tests", scopes=["read", "write"])
    headers = {"Authorization": f"Bearer {key}"}

    job_id = client.submit(_paid())
    _parked(client, job_id)
    assert client.view(job_id).job.status == "running"
    one = {"id": "one", "action": "drill.count", "with": {"name": "one"}}
    other = client.submit({"name": "meanwhile", "steps": [one]})
    assert client.wait_final(other, 20).job.status == "succeeded", "the worker is free"
    client.broker.flushdb()

    sent = httpx.post(
        f"{base}/v1/jobs/{job_id}/signals/payment",
        json={"payload": {"amount": 42, "by": "bank"}},
        headers=headers,
        timeout=10,
    )
    assert sent.status_code == 200, sent.text
    assert sent.json()["signal"]["resumed"] == ["charge"]
    done = client.wait_final(job_id, 30)

    assert done.job.status == "succeeded", done.job.error
    assert done.job.result["ship"]["value"] == "bank"
    assert client.count(job_id, "charge") == 1 and client.count(job_id, "ship") == 1
    with FlowbeatClient(base, key) as fb, pytest.raises(FlowbeatApiError) as again:
        fb.jobs.signal(str(job_id), "payment", payload={"amount": 1})
    assert (again.value.status, again.value.code) == (409, "signal_already_received")


def test_a_wait_with_no_signal_in_time_goes_on_reading_null(
    client: Client, cluster: Cluster
) -> None:
    cluster.worker(concurrency=1)
    cluster.beat(beat_lock_ttl_s="1.5")

    job_id = client.submit(_paid(timeout_s=2, on_timeout="continue"))
    done = client.wait_final(job_id, 30)

    assert done.job.status == "succeeded", done.job.error
    assert done.job.result["ship"]["value"] is None
    assert client.count(job_id, "charge") == 1
