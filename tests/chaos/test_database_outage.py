"""PostgreSQL cut off from the API, the workers and beat, through a TCP proxy that drops every
connection and refuses new ones: once briefly (what a restart looks like to a client) and once
for long (an outage), while jobs are POSTed. Meanwhile the API refuses with
``503 database_unavailable``; afterwards everything recovers on its own, and every job the API
accepted succeeds.

The shared server cannot be restarted under other tests' feet, so a restart is played by the
proxy; a real restart looks the same to the clients (every connection dropped, then refused
until the server is back), and ``test_database_restarts`` crashes and restarts a server of its
own."""

import time

import pytest
from sqlalchemy import make_url

from tests.chaos.executions import checkpoints, examine, executions
from tests.chaos.load import Poster, finished, first_finish_after, lost_jobs, write_key
from tests.chaos.results import record, scaled
from tests.e2e.conftest import FINAL, Client, Cluster, wait_for
from tests.support.tcpproxy import TcpProxy

CUTS_S = (1.0, float(scaled(ci=6, full=30)))
OUTAGE_MARGIN_S = 2.0
"""A checkpoint in flight when the connections drop, or sent on a connection not yet found dead
just after the network is back, fails too: its execution may run again."""
QUICK = {"sweep_interval_s": "1", "lease_s": "4", "dispatch_grace_s": "2", "stall_after_s": "15"}


@pytest.mark.drill
@pytest.mark.timeout(scaled(ci=180, full=600))
def test_postgres_cut_off_briefly_and_for_long_loses_no_accepted_job(
    client: Client, cluster: Cluster
) -> None:
    direct = make_url(cluster.stack.database_url)
    with TcpProxy(direct.host or "127.0.0.1", direct.port or 5432) as proxy:
        proxied = direct.set(host="127.0.0.1", port=proxy.port).render_as_string(False)
        settings = {"database_url": proxied, **QUICK}
        base = cluster.api(**settings)
        cluster.beat(**settings)
        cluster.worker(concurrency=2, **settings)
        healed, outages = [], []
        with Poster(base, write_key(client)) as poster:
            for cut_s in CUTS_S:
                time.sleep(3.0)
                cut = time.time()
                proxy.cut()
                time.sleep(cut_s)
                proxy.heal()
                healed.append(time.time())
                outages.append((cut - OUTAGE_MARGIN_S, healed[-1] + OUTAGE_MARGIN_S))
            time.sleep(3.0)
        accepted = poster.accepted

        def settled() -> bool:
            return all(s in FINAL for s, _ in finished(client, accepted).values())

        wait_for(settled, scaled(ci=120, full=600), "every accepted job to finish")
    done = finished(client, accepted)
    lost = lost_jobs(accepted, done)
    runs = executions(client.counters, accepted)
    findings = examine(runs, checkpoints(client, accepted), killed={}, outages=outages)
    record(
        "PostgreSQL cut off (a restart, then an outage) under load",
        f"cuts of {CUTS_S[0]:.0f} s and {CUTS_S[1]:.0f} s; "
        f"{len(poster.refused)} POSTs refused with 503 meanwhile",
        len(accepted),
        len(lost),
        findings.doubled,
        first_finish_after(done, healed),
        findings.reruns,
    )
    assert accepted and not lost, f"{len(lost)} accepted jobs did not succeed"
    findings.assert_exactly_once()
    assert poster.refused, "no POST met the outage"
    assert set(poster.refused) == {"503 database_unavailable"}, set(poster.refused)
