"""A worker lost as a whole (main process and pool at once, as an OOM kill, a lost machine or a
pod deleted without grace do) gives back what it had taken: the messages it had prefetched but
not started run on another worker within the lease plus a sweep, with the visibility timeout
and the stall sweep at their five-minute defaults. A busy worker's messages stay its own.

The processes run with the production defaults of every setting that bounds recovery, so the
bound these tests show is the one a deployment gets."""

import uuid

import pytest

from service.platform.constants import BROKER_EPOCH_KEY, QUEUE_STEPS
from tests.chaos.executions import checkpoints, examine, executions
from tests.e2e.conftest import Client, Cluster, wait_for
from tests.support.held import Held, held_by, held_jobs

DEFAULTS = {
    "lease_s": "30",
    "sweep_interval_s": "10",
    "stall_after_s": "300",
    "dispatch_grace_s": "10",
    "visibility_timeout_s": "300",
    "unacked_restore_interval_s": "10",
    "worker_prefetch": "4",
    "worker_disable_prefetch": "false",
}
RECOVERY_BOUND_S = 60
TOP_UP = {
    "flowbeat.run_step": ("chaos-chain", {}),
    "flowbeat.run_lane": ("chaos-fan", {"items": list(range(6))}),
    "flowbeat.compensate": ("chaos-saga", {}),
}
KINDS = set(TOP_UP)
EXTRA_OF_A_KIND = 2
"""Sagas and fan-outs added, of each, while the worker does not hold that kind: few, so that
what is left when it dies still runs well within the recovery bound."""


@pytest.fixture(autouse=True)
def broker_seen(client: Client) -> None:
    """The sweeper has seen this broker before: otherwise its first pass takes the fresh
    Redis DB for one that lost everything and sends every open job again, which would
    recover the dead worker's jobs for it."""
    client.broker.set(BROKER_EPOCH_KEY, "seen", nx=True)


def _waiting(client: Client, messages: list[Held]) -> list[uuid.UUID]:
    jobs = {uuid.UUID(m.job_id) for m in messages if m.job_id is not None}
    return [job for job in jobs if client.view(job).job.status == "queued"]


@pytest.mark.drill
@pytest.mark.timeout(360)
def test_a_whole_worker_killed_holding_prefetched_steps_lanes_and_compensations(
    client: Client, cluster: Cluster
) -> None:
    cluster.beat(**DEFAULTS)
    doomed = cluster.worker(concurrency=2, **DEFAULTS)
    jobs: dict[uuid.UUID, str] = {}
    for _ in range(4):
        jobs[client.submit("chaos-saga", hold_s=0.4)] = "chaos-saga"
        jobs[client.submit("chaos-fan", items=list(range(6)), hold_s=0.4)] = "chaos-fan"
        jobs[client.submit("chaos-chain", hold_s=0.4)] = "chaos-chain"

    extra = dict.fromkeys(KINDS, 0)

    def holding() -> list[Held] | None:
        """Every kind of message, and a job it has not started. Chains keep arriving, so that
        the worker takes some while it runs others, and a saga or a fan-out now and then while
        it holds none of their kind, however the machine's pace spreads the first ones out."""
        messages = [m for found in held_by(client.broker, doomed.popen.pid).values() for m in found]
        missing = KINDS - {m.task for m in messages}
        if not missing and _waiting(client, messages):
            return messages
        if client.broker.llen(QUEUE_STEPS) < 4:
            jobs[client.submit("chaos-chain", hold_s=0.4)] = "chaos-chain"
            for kind in missing - {"flowbeat.run_step"}:
                if extra[kind] < EXTRA_OF_A_KIND:
                    extra[kind] += 1
                    profile, params = TOP_UP[kind]
                    jobs[client.submit(profile, hold_s=0.4, **params)] = profile
        return None

    messages = wait_for(holding, 180, "the worker to hold every kind and a job not started")
    waiting = _waiting(client, messages)
    killed = doomed.kill_whole()
    at = min(killed.values())
    cluster.worker(concurrency=2, **DEFAULTS)

    wait_for(lambda: client.settled_at(list(jobs)), RECOVERY_BOUND_S + 30, "every job to finish")
    settled = client.settled_at(waiting)
    assert settled is not None and settled - at <= RECOVERY_BOUND_S
    everything = client.settled_at(list(jobs))
    assert everything is not None and everything - at <= RECOVERY_BOUND_S
    for job, profile in jobs.items():
        expected = "failed" if profile == "chaos-saga" else "succeeded"
        assert client.view(job).job.status == expected, (job, profile)
    findings = examine(executions(client.counters, jobs), checkpoints(client, list(jobs)), killed)
    findings.assert_exactly_once()


@pytest.mark.drill
@pytest.mark.timeout(360)
def test_a_busy_workers_messages_are_not_taken_when_another_dies(
    client: Client, cluster: Cluster
) -> None:
    """The busy worker runs a 60 s step and holds a message in reserve behind it, far longer
    than a dead worker's silence; none of its jobs runs a step twice. The doomed worker is
    killed holding some of its own jobs, and the busy worker's step outlasts all of that,
    however slowly the machine starts workers and polls."""
    cluster.beat(**DEFAULTS)
    busy = cluster.worker(concurrency=1, **{**DEFAULTS, "worker_prefetch": "2"})
    kept = [client.submit("slow", hold_s=60), client.submit("slow", hold_s=2)]
    wait_for(
        lambda: held_jobs(client.broker, busy.popen.pid) == set(kept),
        30,
        "the busy worker to run one job and hold the other",
    )
    doomed = cluster.worker(concurrency=2, **DEFAULTS)
    lost = [client.submit("slow", hold_s=20) for _ in range(3)]
    wait_for(
        lambda: (
            held_jobs(client.broker, doomed.popen.pid) & set(lost)
            and held_jobs(client.broker, busy.popen.pid) == set(kept)
        ),
        60,
        "the doomed worker to hold some of its jobs, the busy worker still both of its own",
    )
    doomed.kill_whole()
    cluster.worker(concurrency=2, **DEFAULTS)

    wait_for(lambda: client.settled_at(kept + lost), 240, "every job to finish")
    for job in kept + lost:
        assert client.view(job).job.status == "succeeded"
    for job in kept:
        assert client.count(job, "slow", "started") == 1, "a busy worker's job ran twice"
        assert client.checkpoints(job, "slow") == 1
        ran_in = int(client.counters.get(f"drill:{job}:slow:pid") or 0)
        assert ran_in in busy.children(), "a busy worker's job ran elsewhere"
    assert busy.popen.poll() is None
