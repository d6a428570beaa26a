"""A worker host cut off from PostgreSQL and Redis past the lease, and a worker host killed,
each while its steps hold longer than a lease: the other two worker hosts take the steps over
once the lease lapses, every job succeeds, and no step runs twice outside the host at fault."""

import time
from functools import partial

import pytest

from tests.chaos.load import await_settled, lost_jobs, write_key
from tests.cluster.deployment import LEASE_S, Deployment
from tests.cluster.results import record
from tests.cluster.steps import (
    after_checkpoint,
    checkpointed,
    in_flight,
    judge,
    post_jobs,
)
from tests.e2e.conftest import Client, wait_for

JOBS = 6
HOLD_S = 4.0
"""Longer than a lease: a step outlives its lease on the host at fault."""


@pytest.mark.timeout(180)
def test_a_worker_host_cut_off_past_the_lease_gives_its_steps_to_the_others(
    hosts: Deployment, reader: Client
) -> None:
    started = time.monotonic()
    cut_off = hosts.workers[0]
    jobs = post_jobs(hosts, hosts.apis[0], write_key(reader), JOBS, hold_s=HOLD_S)
    pids = cut_off.pids()
    held = wait_for(partial(in_flight, reader, jobs, pids), 60, "a step running on worker1")
    hosts.net.partition(cut_off, [hosts.pg_address, hosts.redis_address])
    cut_at = time.time()
    wait_for(
        partial(checkpointed, reader, jobs, held, cut_at),
        10 * LEASE_S,
        "the cut-off host's steps to run to their checkpoint on another host",
    )
    cut_s = time.time() - cut_at
    pids += [pid for pid in cut_off.pids() if pid not in pids]
    hosts.net.heal()
    healed_at = time.time()
    done = await_settled(reader, jobs, 120)
    lost = lost_jobs(jobs, done)
    verdict = judge(reader, jobs, pids, cut_at, healed_at)
    record(
        "a worker host cut off from PostgreSQL and Redis past the lease",
        f"worker1 partitioned from both ({len(held)} step(s) in flight, lease {LEASE_S} s, "
        f"steps holding {HOLD_S:.0f} s) until another host checkpointed them ({cut_s:.1f} s), "
        f"then healed; {verdict.ran_on} cut-off copies ran on to their end once healed",
        jobs=len(jobs),
        lost=len(lost),
        doubled=verdict.findings.doubled,
        reruns=verdict.set_aside + verdict.findings.reruns,
        recovery_s=verdict.recovery_s,
        started=started,
    )
    assert not lost, f"{len(lost)} jobs did not succeed"
    assert verdict.findings.unmatched == 0, "a checkpoint is not of the last execution to end"
    assert after_checkpoint(reader, jobs) == 0, "a step started again after its checkpoint"
    verdict.findings.assert_exactly_once()


@pytest.mark.timeout(180)
def test_a_worker_host_killed_holding_steps_gives_them_to_the_others(
    hosts: Deployment, reader: Client
) -> None:
    started = time.monotonic()
    victim = hosts.workers[1]
    jobs = post_jobs(hosts, hosts.apis[1], write_key(reader), JOBS, hold_s=HOLD_S)
    pids = victim.pids()
    held = wait_for(partial(in_flight, reader, jobs, pids), 60, "a step running on worker2")
    killed = victim.kill_all()
    killed_at = min(killed.values())
    done = await_settled(reader, jobs, 120)
    lost = lost_jobs(jobs, done)
    verdict = judge(reader, jobs, killed.keys(), killed_at, killed_at)
    record(
        "a worker host killed holding steps",
        f"every process of worker2 SIGKILLed ({len(killed)} processes, {len(held)} step(s) "
        f"in flight, lease {LEASE_S} s, steps holding {HOLD_S:.0f} s)",
        jobs=len(jobs),
        lost=len(lost),
        doubled=verdict.findings.doubled,
        reruns=verdict.set_aside + verdict.findings.reruns,
        recovery_s=verdict.recovery_s,
        started=started,
    )
    assert not lost, f"{len(lost)} jobs did not succeed"
    verdict.findings.assert_exactly_once()
