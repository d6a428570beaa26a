"""Workers SIGKILLed at random moments while jobs of mixed shapes, sent at a steady rate, run on
two workers with beat's sweeper: chains, fan-outs with a join (half of them of short items,
which their lanes run in batches), loops of two rounds followed by a step their condition skips,
and sagas whose last step fails for good so that the two before it are undone. Most kills hit
one pool process, which the worker replaces; some hit a worker's main process alone, leaving its
pool processes orphaned (Celery has the kernel SIGKILL them when their parent dies; one that
outlived it would finish what it runs under its lease); the rest a whole worker (its main and
pool processes at once, as when its container or machine dies). A fresh worker replaces a killed
main process, as a supervisor would.

What must hold: every job ends as its shape says (a saga failed with both compensations done),
a step skipped by its condition never runs, no two executions of a step overlap, and the
checkpoint of every step, item, loop round and compensation is written once: of its executions
that ran to their end, the last is the checkpointed attempt and every one before it was cut off
by a kill after it ended (an action's body runs at least once), and none starts after the
checkpoint, so nothing downstream runs twice. Every execution a kill cut short starts again,
and every one an orphaned pool process was running ends or starts again, within 60 s."""

import contextlib
import os
import random
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.chaos.executions import checkpoints, examine, executions
from tests.chaos.load import describe
from tests.chaos.results import record, scaled
from tests.e2e.conftest import FINAL, Client, Cluster, Proc

JOBS = scaled(ci=40, full=2000)
JOBS_PER_S = scaled(ci=20, full=3)
"""A rate the two workers keep up with while they are being killed (about 4 jobs/s here): the
time a cut-short step takes to run again is measured, not the depth of a queue that all 2,000
jobs sent at once would make (a step requeued behind it waited minutes, 148 s at p99)."""
KILLS = scaled(ci=8, full=200)
WORKERS = 2
KILL_CYCLE = ("pool", "pool", "main", "pool", "whole")
PAUSE_S = (0.2, 0.8)
QUICK = {
    "lease_s": "4",
    "sweep_interval_s": "2",
    "stall_after_s": "20",
    "visibility_timeout_s": "15",
    "unacked_restore_interval_s": "1",
}
RECOVERY_BOUND_S = 60
ORPHAN_GRACE_S = 3.0
"""How long an orphaned pool process is watched for dying with its parent."""
SAGA_UNDONE = 2
SHORT_FANS = 0.5
"""The share of fan-outs whose items hold 5 ms, which their lanes take and checkpoint in
batches (ADR 27), so that kills land between a batch's shards and its checkpoint."""


def _submit_mixed(client: Client, rng: random.Random, jobs: dict[uuid.UUID, str], due: int) -> None:
    """Submit until ``due`` jobs are in, recording each job's id and profile."""
    while len(jobs) < min(due, JOBS):
        shape = rng.choices(["chain", "fan", "loop", "saga"], weights=[3, 3, 2, 2])[0]
        if shape == "fan" and rng.random() < SHORT_FANS:
            params: dict[str, object] = {"items": list(range(rng.randint(20, 40))), "hold_s": 0.005}
        elif shape == "fan":
            params = {"items": list(range(rng.randint(2, 6)))}
        else:
            params = {"hold_s": rng.choice([0.1, 0.3])}
        jobs[client.submit(f"chaos-{shape}", **params)] = f"chaos-{shape}"


@dataclass
class Outcome:
    statuses: dict[uuid.UUID, str]
    undone: dict[uuid.UUID, list[str]]
    skipped: dict[uuid.UUID, str]

    def settled(self) -> bool:
        compensating = any(s in ("pending", "running") for u in self.undone.values() for s in u)
        return all(s in FINAL for s in self.statuses.values()) and not compensating


def _outcome(client: Client, jobs: dict[uuid.UUID, str]) -> Outcome:
    from sqlalchemy import select

    from service.platform.db import unit_of_work
    from service.platform.models import CompensationRow, JobRow, StepRunRow

    ids = list(jobs)
    with unit_of_work(client.rt.sessions) as session:
        statuses = session.execute(select(JobRow.id, JobRow.status).where(JobRow.id.in_(ids)))
        status_of = {job_id: str(status) for job_id, status in statuses}
        undone: dict[uuid.UUID, list[str]] = {}
        rows = select(CompensationRow.job_id, CompensationRow.status)
        for job_id, status in session.execute(rows.where(CompensationRow.job_id.in_(ids))):
            undone.setdefault(job_id, []).append(str(status))
        conditional = select(StepRunRow.job_id, StepRunRow.status).where(
            StepRunRow.job_id.in_(ids), StepRunRow.step_id == "extra"
        )
        skipped = {job_id: str(status) for job_id, status in session.execute(conditional)}
    return Outcome(status_of, undone, skipped)


def _as_its_shape(outcome: Outcome, job_id: uuid.UUID, profile: str) -> bool:
    if profile == "chaos-saga":
        completed = outcome.undone.get(job_id, []) == ["compensated"] * SAGA_UNDONE
        return outcome.statuses[job_id] == "failed" and completed
    if profile == "chaos-loop" and outcome.skipped.get(job_id) != "skipped":
        return False
    return outcome.statuses[job_id] == "succeeded"


def _gone(pid: int) -> bool:
    """Exited, whether or not its new parent has reaped it yet."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


@dataclass
class Killer:
    cluster: Cluster
    rng: random.Random
    workers: list[Proc] = field(default_factory=list)
    killed: dict[int, float] = field(default_factory=dict)
    """Each pid killed, and by when it was dead."""
    orphaned: dict[int, float] = field(default_factory=dict)
    """Pool processes that outlived their killed main process, and when it was killed."""
    groups: list[int] = field(default_factory=list)
    made: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KILL_CYCLE, 0))

    def kill(self, kind: str) -> None:
        worker = self.rng.choice([w for w in self.workers if w.popen.poll() is None])
        pool = worker.children()
        kind = kind if pool else "whole"
        if kind == "pool":
            victim = self.rng.choice(pool)
            os.kill(victim, signal.SIGKILL)
            self.killed[victim] = time.time()
            self.made[kind] += 1
            return
        if kind == "main":
            self._kill_main(worker, pool)
        else:
            worker.kill()
            self.killed |= dict.fromkeys([worker.popen.pid, *pool], time.time())
        self.made[kind] += 1
        self.workers.remove(worker)
        self.workers.append(self.cluster.worker(concurrency=2, **QUICK))

    def _kill_main(self, worker: Proc, pool: list[int]) -> None:
        """Only the main process: its pool processes are orphaned. Those that die with it (as
        Celery has the kernel do) count as killed when seen gone; the others as orphaned."""
        os.kill(worker.popen.pid, signal.SIGKILL)
        worker.popen.wait(timeout=10)
        at = time.time()
        self.killed[worker.popen.pid] = at
        self.groups.append(worker.popen.pid)
        deadline = time.monotonic() + ORPHAN_GRACE_S
        alive = set(pool)
        while alive and time.monotonic() < deadline:
            for pid in [pid for pid in alive if _gone(pid)]:
                self.killed[pid] = time.time()
                alive.discard(pid)
            time.sleep(0.05)
        self.orphaned |= dict.fromkeys(alive, at)

    def reap(self) -> None:
        """The orphaned pool processes of a killed main process that are still there."""
        for group in self.groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)


@pytest.fixture
def killer(cluster: Cluster) -> Iterator[Killer]:
    made = Killer(cluster, random.Random(int(os.environ.get("FLOWBEAT_CHAOS_SEED", "7"))))
    yield made
    made.reap()


@pytest.mark.drill
@pytest.mark.timeout(scaled(ci=240, full=3600))
def test_random_worker_kills_under_load_lose_and_double_nothing(
    client: Client, cluster: Cluster, killer: Killer
) -> None:
    cluster.beat(**QUICK)
    killer.workers += [cluster.worker(concurrency=2, **QUICK) for _ in range(WORKERS)]
    jobs: dict[uuid.UUID, str] = {}
    kills = 0

    started = time.monotonic()
    deadline = started + scaled(ci=150, full=3000)
    while time.monotonic() < deadline and (
        len(jobs) < JOBS or not _outcome(client, jobs).settled()
    ):
        _submit_mixed(client, killer.rng, jobs, int((time.monotonic() - started) * JOBS_PER_S) + 1)
        time.sleep(killer.rng.uniform(*PAUSE_S))
        if kills < KILLS:
            killer.kill(KILL_CYCLE[kills % len(KILL_CYCLE)])
            kills += 1

    outcome = _outcome(client, jobs)
    lost = [job for job, profile in jobs.items() if not _as_its_shape(outcome, job, profile)]
    runs = executions(client.counters, jobs)
    findings = examine(
        runs, checkpoints(client, list(jobs)), killer.killed, orphaned=killer.orphaned
    )
    made = killer.made
    record(
        "workers SIGKILLed under load",
        f"{kills} SIGKILLs: {made['pool']} pool processes, {made['main']} main processes alone "
        f"({len(killer.orphaned)} pool processes outlived theirs), {made['whole']} whole workers",
        len(jobs),
        len(lost),
        findings.doubled,
        findings.recovery_s,
        findings.reruns,
    )
    assert not lost, f"{len(lost)} jobs did not end as their shape says:\n" + describe(
        client, lost[:10]
    )
    findings.assert_exactly_once()
    assert not [key for key in runs if ":extra:" in key], "a step skipped by its condition ran"
    assert findings.unrecovered == 0, "an execution cut short by a kill never ran again"
    assert max(findings.recovery_s, default=0.0) <= RECOVERY_BOUND_S
    assert kills == KILLS, "the jobs finished before every kill was made"
    assert made["main"] and made["whole"], made
