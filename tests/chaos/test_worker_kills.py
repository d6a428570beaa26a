"""Workers SIGKILLed at random moments while jobs of mixed shapes (chains, fan-outs with a
join) run on two workers with beat's sweeper: most kills hit one pool process, which the
worker replaces, the rest a whole worker (its main and pool processes at once, as when its
container or machine dies), which a fresh worker replaces, as a supervisor would.

What must hold: every job succeeds, no step or item runs to the end twice or in two copies
at once, and every execution a kill cut short starts again within 60 s."""

import os
import random
import signal
import time
import uuid

import pytest

from tests.chaos.executions import examine, executions
from tests.chaos.results import record, scaled
from tests.e2e.conftest import FINAL, Client, Cluster, Proc

JOBS = scaled(ci=40, full=2000)
KILLS = scaled(ci=8, full=200)
WORKERS = 2
WHOLE_WORKER_EVERY = 5
PAUSE_S = (0.2, 0.8)
QUICK = {
    "lease_s": "4",
    "sweep_interval_s": "2",
    "stall_after_s": "20",
    "visibility_timeout_s": "15",
    "unacked_restore_interval_s": "1",
}
RECOVERY_BOUND_S = 60


def _submit_mixed(client: Client, rng: random.Random) -> list[uuid.UUID]:
    jobs = []
    for _ in range(JOBS):
        if rng.random() < 0.5:
            jobs.append(client.submit("chaos-chain", hold_s=rng.choice([0.1, 0.3])))
        else:
            jobs.append(client.submit("chaos-fan", items=list(range(rng.randint(2, 6)))))
    return jobs


def _statuses(client: Client, job_ids: list[uuid.UUID]) -> dict[uuid.UUID, str]:
    from sqlalchemy import select

    from service.db import unit_of_work
    from service.models import JobRow

    with unit_of_work(client.rt.sessions) as session:
        rows = session.execute(select(JobRow.id, JobRow.status).where(JobRow.id.in_(job_ids)))
        return {job_id: status for job_id, status in rows}


def _kill_one(
    cluster: Cluster, workers: list[Proc], rng: random.Random, whole: bool
) -> tuple[list[int], bool]:
    """The pids killed, and whether that was a whole worker."""
    worker = rng.choice([w for w in workers if w.popen.poll() is None])
    pool = worker.children()
    if pool and not whole:
        victim = rng.choice(pool)
        os.kill(victim, signal.SIGKILL)
        return [victim], False
    worker.kill()
    workers.remove(worker)
    workers.append(cluster.worker(concurrency=2, **QUICK))
    return [worker.popen.pid, *pool], True


@pytest.mark.drill
@pytest.mark.timeout(scaled(ci=240, full=3600))
def test_random_worker_kills_under_load_lose_and_double_nothing(
    client: Client, cluster: Cluster
) -> None:
    rng = random.Random(int(os.environ.get("FLOWBEAT_CHAOS_SEED", "7")))
    cluster.beat(**QUICK)
    workers = [cluster.worker(concurrency=2, **QUICK) for _ in range(WORKERS)]
    job_ids = _submit_mixed(client, rng)
    killed: dict[int, float] = {}
    kills = whole_workers = 0

    deadline = time.monotonic() + scaled(ci=150, full=3000)
    while time.monotonic() < deadline:
        statuses = _statuses(client, job_ids)
        if all(s in FINAL for s in statuses.values()):
            break
        time.sleep(rng.uniform(*PAUSE_S))
        if kills < KILLS:
            whole_next = kills % WHOLE_WORKER_EVERY == WHOLE_WORKER_EVERY - 1
            pids, whole = _kill_one(cluster, workers, rng, whole_next)
            killed |= dict.fromkeys(pids, time.time())
            kills += 1
            whole_workers += whole

    statuses = _statuses(client, job_ids)
    lost = [job for job, status in statuses.items() if status != "succeeded"]
    findings = examine(executions(client.counters, job_ids), killed)
    record(
        "workers SIGKILLed under load",
        f"{kills} SIGKILLs: {kills - whole_workers} pool processes, {whole_workers} whole workers",
        len(job_ids),
        len(lost),
        findings.concurrent,
        findings.recovery_s,
        findings.completed_twice,
    )
    assert not lost, f"{len(lost)} jobs did not succeed: {[statuses[j] for j in lost][:5]}"
    assert findings.concurrent == 0, "a step ran in two copies at once"
    assert findings.unrecovered == 0, "an execution cut short by a kill never ran again"
    assert max(findings.recovery_s, default=0.0) <= RECOVERY_BOUND_S
    assert kills == KILLS, "the jobs finished before every kill was made"
