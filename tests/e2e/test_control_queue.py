"""The sweeper is not queued behind the steps it is there to recover.

One worker running one step at a time has a backlog of slow steps; a sweep sent now must run
within a step or two, not once the backlog has drained.
"""

import re

from service.platform.constants import BROKER_EPOCH_KEY, TASK_SWEEP
from tests.e2e.conftest import Client, Cluster, wait_for

HOLD_S = 1.0
BACKLOG_JOBS = 16
PROMPTLY_S = 6 * HOLD_S


def test_a_sweep_sent_behind_a_backlog_of_steps_runs_before_the_backlog_drains(
    client: Client, cluster: Cluster
) -> None:
    client.broker.set(BROKER_EPOCH_KEY, "kept", nx=True)
    worker = cluster.worker(concurrency=1, worker_prefetch="1")
    jobs = [client.submit("slow", hold_s=HOLD_S) for _ in range(BACKLOG_JOBS)]
    wait_for(lambda: client.count(jobs[0], "slow", "started"), 30, "the first slow step")

    sweep = client.app.send_task(TASK_SWEEP).id
    wait_for(
        lambda: re.search(rf"Task {re.escape(TASK_SWEEP)}\[{sweep}\] succeeded", worker.output()),
        PROMPTLY_S,
        "the sweep to run",
    )

    unfinished = [job for job in jobs if client.view(job).job.status != "succeeded"]
    assert len(unfinished) > BACKLOG_JOBS // 2, "the backlog drained first: nothing was shown"
    for job in jobs:
        assert client.wait_final(job, timeout_s=60).job.status == "succeeded"
