"""Every flowbeat process behind PgBouncer in transaction pooling mode, with fewer server
connections than clients: jobs, fan-outs, concurrency keys, the beat's wakeups and live event
streams work as they do on direct connections, and the traffic really went through it."""

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from service.platform.auth import create_api_key
from service.platform.db import unit_of_work
from tests.conftest import Stack
from tests.e2e.conftest import Client, Cluster
from tests.support.pgbouncer import PGBOUNCER, SERVER_CONNECTIONS, admin, pgbouncer

pytestmark = pytest.mark.skipif(
    not PGBOUNCER.exists(), reason="needs Debian's pgbouncer (.ci/run installs it)"
)

CHAIN = {
    "name": "pooled-chain",
    "params": {"items": {"type": "array", "default": [1, 2, 3]}},
    "steps": [
        {"id": "a", "action": "drill.count", "with": {"name": "a"}},
        {"id": "b", "action": "drill.count", "with": {"name": "b"}, "depends_on": ["a"]},
        {
            "id": "each",
            "action": "drill.count",
            "depends_on": ["b"],
            "for_each": {"items": "${{ params.items }}"},
            "with": {"name": "each", "value": "${{ item }}"},
        },
    ],
}
KEYED = {
    "name": "pooled-keyed",
    "params": {"tenant": {"type": "string"}},
    "concurrency": {"key": "${{ params.tenant }}", "limit": 1},
    "steps": [{"id": "call", "action": "drill.count", "with": {"name": "call", "hold_s": 0.2}}],
}


@pytest.fixture
def pooled(stack: Stack) -> Iterator[dict[str, str]]:
    """The settings of a process whose database is reached through PgBouncer."""
    with pgbouncer(stack.database_url) as url:
        yield {
            "database_url": url,
            "database_pooled": "true",
            "database_listen_url": stack.database_url,
        }


def _key(client: Client) -> dict[str, str]:
    with unit_of_work(client.rt.sessions) as session:
        key, _ = create_api_key(session, owner=f"pooled-{uuid.uuid4().hex[:6]}", scopes=["write"])
    return {"Authorization": f"Bearer {key}"}


def _submit(api: str, headers: dict[str, str], body: dict[str, Any]) -> uuid.UUID:
    answer = httpx.post(f"{api}/v1/jobs", json=body, headers=headers, timeout=30)
    assert answer.status_code == 202, answer.text
    return uuid.UUID(answer.json()["job"]["id"])


def _events(api: str, headers: dict[str, str], job_id: uuid.UUID) -> list[dict[str, Any]]:
    """The job's stream, followed live (LISTEN on the direct connection) until it is final."""
    with httpx.stream(
        "GET",
        f"{api}/v1/jobs/{job_id}/events",
        headers={**headers, "Accept": "application/x-ndjson"},
        timeout=60,
    ) as answer:
        assert answer.status_code == 200
        return [json.loads(line) for line in answer.iter_lines() if line]


@pytest.mark.timeout(180)
def test_every_process_works_through_a_transaction_pooler(
    client: Client, cluster: Cluster, pooled: dict[str, str]
) -> None:
    api = cluster.api(**pooled)
    cluster.worker(concurrency=2, **pooled)
    cluster.beat(**pooled)
    headers = _key(client)
    watched = _submit(api, headers, {"pipeline": CHAIN})
    chains = [_submit(api, headers, {"pipeline": CHAIN}) for _ in range(15)]
    keyed = [
        _submit(api, headers, {"pipeline": KEYED, "params": {"tenant": "acme"}}) for _ in range(4)
    ]

    events = _events(api, headers, watched)

    assert events[-1]["kind"] == "job.succeeded"
    for job in [watched, *chains, *keyed]:
        assert client.wait_final(job, timeout_s=90).job.status == "succeeded"
    assert all(client.count(job, "each") == 3 for job in chains)
    assert all(client.count(job, "call") == 1 for job in keyed)
    database = pooled["database_url"].rsplit("/", 1)[1]
    stats = admin(pooled["database_url"], "SHOW STATS")[database]
    servers = admin(pooled["database_url"], "SHOW POOLS")[database]
    assert stats["total_xact_count"] > 100, "the processes' transactions went through it"
    assert servers["sv_active"] + servers["sv_idle"] + servers["sv_used"] <= SERVER_CONNECTIONS


def test_a_pooled_database_needs_a_direct_connection_for_listen() -> None:
    from pydantic import ValidationError

    from service.platform.settings import Settings

    with pytest.raises(ValidationError, match="FLOWBEAT_DATABASE_LISTEN_URL"):
        Settings(
            database_url="postgresql+psycopg://u@pooler:6432/db",
            broker_url="redis://127.0.0.1:6379/0",
            database_pooled=True,
        )
