"""The network between the workers and Redis cut, through a TCP proxy, for longer than a step's
lease, while steps run: the steps already running finish, their messages come back when the
network does, and no step ever runs in two copies at once; every job succeeds."""

import time
import uuid

import pytest
from sqlalchemy import make_url

from tests.chaos.executions import examine, executions
from tests.chaos.load import finished, first_finish_after
from tests.chaos.results import record, scaled
from tests.e2e.conftest import FINAL, Client, Cluster, wait_for
from tests.support.tcpproxy import TcpProxy

CUTS = scaled(ci=1, full=5)
LEASE_S = 3
CUT_S = 3 * LEASE_S
QUICK = {
    "lease_s": str(LEASE_S),
    "sweep_interval_s": "1",
    "visibility_timeout_s": "20",
    "unacked_restore_interval_s": "1",
}


@pytest.mark.drill
@pytest.mark.timeout(scaled(ci=180, full=900))
def test_workers_cut_off_from_redis_past_the_lease_never_run_a_step_twice_at_once(
    client: Client, cluster: Cluster
) -> None:
    broker = make_url(cluster.stack.broker_url)
    with TcpProxy(broker.host or "127.0.0.1", broker.port or 6379) as proxy:
        through = f"redis://127.0.0.1:{proxy.port}/{broker.database}"
        cluster.env["DRILL_REDIS_URL"] = cluster.stack.broker_url.rsplit("/", 1)[0] + "/0"
        cluster.beat(**QUICK)
        cluster.worker(concurrency=2, broker_url=through, **QUICK)
        jobs: list[uuid.UUID] = []
        healed = []
        for _ in range(CUTS):
            jobs += [client.submit("chaos-chain", hold_s=1.5) for _ in range(6)]
            wait_for(lambda: bool(list(client.counters.scan_iter("chaos:*"))), 30, "steps")
            time.sleep(1.0)
            proxy.cut()
            time.sleep(CUT_S)
            proxy.heal()
            healed.append(time.time())

        def settled() -> bool:
            return all(s in FINAL for s, _ in finished(client, jobs).values())

        wait_for(settled, scaled(ci=120, full=600), "every job to finish")
    done = finished(client, jobs)
    lost = [job for job, (status, _) in done.items() if status != "succeeded"]
    findings = examine(executions(client.counters, jobs), {})
    record(
        "workers cut off from Redis longer than the lease",
        f"{CUTS} cut(s) of {CUT_S} s (lease {LEASE_S} s)",
        len(jobs),
        len(lost),
        findings.concurrent,
        first_finish_after(done, healed),
        findings.completed_twice,
    )
    assert not lost, f"{len(lost)} jobs did not succeed"
    assert findings.concurrent == 0, "a step ran in two copies at once"
