"""Fault drills: real processes are killed and the broker is wiped; no accepted work is lost."""

import os
import signal

import pytest

from tests.e2e.conftest import Client, Cluster, wait_for

pytestmark = pytest.mark.drill


def _pid_running(client: Client, job_id: object, name: str) -> int:
    raw = client.counters.get(f"drill:{job_id}:{name}:pid")
    return int(raw) if raw else 0


def test_a_pool_process_killed_mid_step_reruns_the_step_once_and_downstream_once(
    client: Client, cluster: Cluster
) -> None:
    worker = cluster.worker(concurrency=2)
    job_id = client.submit("slow", hold_s=3)
    wait_for(lambda: client.count(job_id, "slow", "started"), 30, "the slow step to start")
    victim = _pid_running(client, job_id, "slow")
    assert victim in worker.children()

    os.kill(victim, signal.SIGKILL)
    view = client.wait_final(job_id, timeout_s=60)

    assert view.job.status == "succeeded", view.job.error
    assert client.count(job_id, "slow", "started") == 2
    assert client.count(job_id, "slow") == 1
    assert client.steps(job_id)["slow"].attempts == 2
    assert client.checkpoints(job_id, "slow") == 1
    assert client.count(job_id, "after", "started") == 1


def test_a_whole_worker_killed_mid_step_is_taken_over_by_another(
    client: Client, cluster: Cluster
) -> None:
    cluster.beat()
    first = cluster.worker(concurrency=1)
    job_id = client.submit("slow", hold_s=3)
    wait_for(lambda: client.count(job_id, "slow", "started"), 30, "the slow step to start")

    first.kill()
    cluster.worker(concurrency=2)
    view = client.wait_final(job_id, timeout_s=60)

    assert view.job.status == "succeeded", view.job.error
    assert client.count(job_id, "slow") == 1
    assert client.checkpoints(job_id, "slow") == 1
    assert client.count(job_id, "after", "started") == 1


def test_a_broker_wiped_mid_job_loses_nothing(client: Client, cluster: Cluster) -> None:
    cluster.beat()
    cluster.worker(concurrency=1)
    job_id = client.submit("wide")
    wait_for(lambda: client.count(job_id, "hold", "started"), 30, "the first step to start")
    assert client.broker.llen("flowbeat.steps") > 0

    client.broker.flushdb()
    view = client.wait_final(job_id, timeout_s=90)

    assert view.job.status == "succeeded", view.job.error
    for name in ("hold", "p1", "p2", "p3", "last"):
        assert client.count(job_id, name) == 1, name
    assert client.count(job_id, "gather") == 3
    assert client.checkpoints(job_id, "gather") == 4


def test_a_message_redelivered_while_its_step_runs_elsewhere_does_not_start_a_second_copy(
    client: Client, cluster: Cluster
) -> None:
    quick = {"visibility_timeout_s": "1", "unacked_restore_interval_s": "1"}
    first = cluster.worker(concurrency=1, **quick)
    job_id = client.submit("slow", hold_s=6)
    wait_for(lambda: client.count(job_id, "slow", "started"), 30, "the slow step to start")
    second = cluster.worker(concurrency=1, **quick)

    view = client.wait_final(job_id, timeout_s=60)

    assert view.job.status == "succeeded", view.job.error
    assert client.count(job_id, "slow", "started") == 1
    assert client.steps(job_id)["slow"].attempts == 1
    assert client.count(job_id, "after", "started") == 1
    task_id = client.task_id(job_id, "slow")
    deliveries = sum(proc.output().count(f"[{task_id}] received") for proc in (first, second))
    assert deliveries >= 2, "the visibility timeout never redelivered the running step's message"
