"""A lease never outlives its attempt: the next attempt runs at its backoff, not once the lease
lapses.

The worker here holds its leases for a minute, so a retry that waited for one would miss the
deadline every test below sets. It runs one step at a time, so a job's steps share its pool
process and that process's database connections.
"""

from collections.abc import Iterator

import pytest

from tests.conftest import Stack
from tests.drill_actions import named_connections
from tests.e2e.conftest import Client, Cluster, Proc

LEASE_S = 60
PROMPTLY_S = LEASE_S / 3
CONNECTIONS = "flowbeat-long-lease-worker"

pytestmark = pytest.mark.usefixtures("long_lease_worker")


@pytest.fixture(scope="module")
def long_lease_worker(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    cluster = Cluster(stack, tmp_path_factory.mktemp("leases"))
    worker = cluster.worker(
        concurrency=1,
        lease_s=str(LEASE_S),
        database_url=named_connections(stack.database_url, CONNECTIONS),
    )
    yield worker
    cluster.close()


def test_a_step_that_fails_once_is_retried_at_its_backoff(client: Client) -> None:
    job_id = client.submit("flaky", succeed_on=2)
    view = client.wait_final(job_id, timeout_s=PROMPTLY_S)

    assert view.job.status == "succeeded", view.job.error
    assert client.steps(job_id)["flaky"].attempts == 2


def test_fan_out_shards_that_fail_once_are_retried_at_their_backoff(client: Client) -> None:
    profile = {
        "name": "fan-flaky",
        "params": {"items": {"type": "array", "default": [1, 2, 3]}},
        "steps": [
            {
                "id": "each",
                "action": "fail",
                "retry": {"attempts": 3, "backoff_s": 0.1, "jitter": 0},
                "for_each": {"items": "${{ params.items }}", "max_parallel": 2},
                "with": {"message": "transient", "succeed_on_attempt": 2},
            }
        ],
    }
    view = client.wait_final(client.submit(profile), timeout_s=PROMPTLY_S)

    assert view.job.status == "succeeded", view.job.error
    assert view.job.result == {"each": [{"attempt": 2}] * 3}


def test_a_step_whose_checkpoint_met_a_dropped_connection_runs_again_at_once(
    client: Client,
) -> None:
    """PostgreSQL ends the worker's checkpoint in flight (a restart, a failover): the
    checkpoint fails, and the task's retry after the database error claims the step."""
    profile = {
        "name": "dropped",
        "steps": [
            {"id": "warm", "action": "noop"},
            {
                "id": "drop",
                "action": "drill.drop_connections",
                "depends_on": ["warm"],
            },
        ],
    }
    job_id = client.submit(profile)
    view = client.wait_final(job_id, timeout_s=PROMPTLY_S)

    assert view.job.status == "succeeded", view.job.error
    assert view.job.result == {"drop": {"attempt": 2}}
