"""Routing on real workers: a step runs only on a worker of its queue, waits for one without
failing or being sent again, and a job of a higher priority passes a backlog."""

import os
import sys
import time
import uuid
from typing import Any

from service.engine.sweeper import sweep
from service.platform.clock import utcnow
from service.platform.constants import BROKER_EPOCH_KEY
from service.platform.db import unit_of_work
from tasks.broker import read_broker
from tasks.queues import step_list
from tests.e2e.conftest import Client, Cluster, Proc, wait_for

GPU = "gpu"
ROUTED: dict[str, Any] = {
    "name": "routed",
    "steps": [
        {"id": "prep", "action": "drill.count", "with": {"name": "prep"}},
        {
            "id": "train",
            "action": "drill.count",
            "with": {"name": "train"},
            "depends_on": ["prep"],
            "queue": GPU,
        },
        {
            "id": "report",
            "action": "drill.count",
            "with": {"name": "report"},
            "depends_on": ["train"],
        },
    ],
}
SLOW: dict[str, Any] = {
    "name": "slow-one",
    "steps": [{"id": "slow", "action": "drill.count", "with": {"name": "slow", "hold_s": 0.5}}],
}


def _ran_on(client: Client, job: uuid.UUID, name: str, worker: Proc) -> bool:
    pid = client.counters.get(f"drill:{job}:{name}:pid")
    return pid is not None and int(pid) in worker.children()


def _sweep_decides(client: Client, **settings: float) -> set[uuid.UUID]:
    """The jobs one sweeper pass would send again, from what the broker holds now: the pass's
    own decision, without sending the other jobs of this database's earlier tests."""
    broker = read_broker(client.settings.require_broker_url())
    with unit_of_work(client.rt.sessions) as session:
        report = sweep(
            session,
            now=utcnow(),
            broker_lost=False,
            oldest_waiting=broker.oldest_waiting,
            held=broker.held,
            **settings,
        )
    return report.redispatch


def test_a_step_waits_for_a_worker_of_its_queue_and_runs_only_there(
    client: Client, cluster: Cluster
) -> None:
    client.broker.set(BROKER_EPOCH_KEY, "kept", nx=True)
    default = cluster.worker(concurrency=1)
    job = client.submit(ROUTED)
    wait_for(lambda: client.count(job, "prep"), 30, "the default queue's step")
    gpu_list = step_list(GPU, 0)
    wait_for(lambda: client.broker.llen(gpu_list) == 1, 30, "the gpu step's message")
    time.sleep(2.5)

    assert job not in _sweep_decides(client, stall_after_s=2, dispatch_grace_s=1)
    assert client.broker.llen(gpu_list) == 1
    assert client.steps(job)["train"].status == "pending"
    assert client.view(job).job.status == "running"

    gpu = cluster.worker(concurrency=1, worker_queues=GPU)
    assert client.wait_final(job, timeout_s=60).job.status == "succeeded"
    assert _ran_on(client, job, "prep", default)
    assert _ran_on(client, job, "train", gpu)
    assert _ran_on(client, job, "report", default), "a step after a gpu step goes back"


def test_a_job_of_priority_9_sent_last_passes_a_backlog_of_low_priority_ones(
    client: Client, cluster: Cluster
) -> None:
    low = [client.submit(SLOW) for _ in range(8)]
    urgent = client.submit_at(9, SLOW)
    cluster.worker(concurrency=1)
    for job in [*low, urgent]:
        assert client.wait_final(job, timeout_s=60).job.status == "succeeded"

    started = {job: client.steps(job)["slow"].started_at for job in [*low, urgent]}
    ahead = [job for job in low if started[job] < started[urgent]]
    assert len(ahead) <= 2, f"{len(ahead)} low-priority jobs started first"


def test_a_worker_started_with_queues_consumes_those_and_the_control_queue(
    client: Client, cluster: Cluster
) -> None:
    """``flowbeat worker --queues`` as an operator types it."""
    env = {**cluster.env, "FLOWBEAT_WORKER_CONCURRENCY": "1"}
    log = cluster.tmp / f"flowbeat-worker-{uuid.uuid4().hex[:4]}.log"
    argv = [sys.executable, "-m", "service.cli", "worker", "--queues", f"{GPU},default"]
    worker = Proc(argv, {**env, "PYTHONPATH": env.get("PYTHONPATH", os.getcwd())}, log)
    cluster.procs.append(worker)
    worker.wait_ready("ready.")
    job = client.submit(ROUTED)
    assert client.wait_final(job, timeout_s=60).job.status == "succeeded"
    assert all(_ran_on(client, job, name, worker) for name in ("prep", "train", "report"))
    assert "flowbeat.steps.gpu" in worker.output()
