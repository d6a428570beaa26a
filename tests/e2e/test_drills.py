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


def test_a_pool_process_killed_inside_a_loop_round_resumes_that_round(
    client: Client, cluster: Cluster
) -> None:
    worker = cluster.worker(concurrency=2)
    job_id = client.submit("review", approve_at=3, hold_s=1.5)
    wait_for(lambda: client.count(job_id, "draft", "started") == 2, 30, "round 2 to start")
    victim = _pid_running(client, job_id, "draft")
    assert victim in worker.children()

    os.kill(victim, signal.SIGKILL)
    view = client.wait_final(job_id, timeout_s=60)

    assert view.job.status == "succeeded", view.job.error
    draft = client.steps(job_id)["draft"]
    assert [(r.round, r.attempts) for r in draft.rounds] == [(1, 1), (2, 2)]
    assert (draft.round, draft.attempts) == (3, 1)
    assert client.count(job_id, "brief", "started") == 1
    assert client.count(job_id, "draft") == 3
    assert client.count(job_id, "review", "started") == 3
    assert client.count(job_id, "publish", "started") == 1


def test_a_pool_process_killed_right_after_an_approval_runs_the_step_once_more(
    client: Client, cluster: Cluster
) -> None:
    worker = cluster.worker(concurrency=2)
    profile = {
        "name": "gated-slow",
        "steps": [
            {
                "id": "ship",
                "action": "drill.count",
                "approval": {"required": True},
                "with": {"name": "ship", "hold_s": 3},
            },
            {
                "id": "after",
                "action": "drill.count",
                "depends_on": ["ship"],
                "with": {"name": "after"},
            },
        ],
    }
    job_id = client.submit(profile)
    wait_for(lambda: client.view(job_id).job.status == "awaiting_approval", 30, "the gate")
    client.decide(job_id, "ship", approve=True)
    wait_for(lambda: client.count(job_id, "ship", "started"), 30, "the approved step to start")

    os.kill(_pid_running(client, job_id, "ship"), signal.SIGKILL)
    view = client.wait_final(job_id, timeout_s=60)

    assert view.job.status == "succeeded", view.job.error
    assert worker.children()
    assert client.count(job_id, "ship", "started") == 2
    assert client.count(job_id, "ship") == 1
    assert client.checkpoints(job_id, "ship") == 1
    assert client.count(job_id, "after", "started") == 1


def test_a_pool_process_killed_during_a_compensation_leaves_each_compensated_once(
    client: Client, cluster: Cluster
) -> None:
    from tests.e2e.test_sagas import saga

    worker = cluster.worker(concurrency=2)
    job_id = client.submit(saga(hold_s=2))
    wait_for(lambda: client.count(job_id, "undo-transform", "started"), 30, "the first undo")

    os.kill(_pid_running(client, job_id, "undo-transform"), signal.SIGKILL)
    compensation = wait_for(
        lambda: (c := client.view(job_id).compensation) and c["status"] != "running" and c,
        60,
        "the compensations to finish",
    )

    assert worker.children()
    assert compensation["status"] == "completed"
    assert [(s["step_id"], s["attempts"]) for s in compensation["steps"]] == [
        ("transform", 2),
        ("extract", 1),
    ]
    assert client.count(job_id, "undo-transform", "started") == 2
    assert client.count(job_id, "undo-transform") == 1
    assert client.count(job_id, "undo-extract", "started") == 1
