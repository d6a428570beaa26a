"""Every execution of every step, fan-out item, loop round and compensation of a chaos run, read
back from what the ``drill.work`` action recorded, set against what PostgreSQL checkpointed,
and what a run of them may not show.

The contract checked is the README's: an action's body runs at least once (an execution cut off
between its end and its checkpoint runs again: a re-run), its checkpoint and everything after it
exactly once. So of a step's executions that ran to their end, the last is the one whose attempt
the checkpoint names, and each one before it had its process killed after it ended; none starts
after the checkpoint; no two overlap in time."""

import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import redis

from tests.e2e.conftest import Client


@dataclass
class Execution:
    pid: int
    attempt: int
    start: float
    end: float | None = None


@dataclass(frozen=True)
class Checkpoint:
    """The attempt whose outcome PostgreSQL recorded, and when (epoch seconds)."""

    attempt: int
    at: float


@dataclass
class Findings:
    concurrent: int = 0
    """Executions that started while another of the same step was still running."""
    ran_twice: int = 0
    """Executions that ran to their end although another one's checkpoint was kept, or that
    started after the checkpoint: the checkpoint and what follows it would have happened twice."""
    reruns: int = 0
    """Executions that ran to their end and were then killed before their checkpoint: the body
    running again is the at-least-once the README promises."""
    unmatched: int = 0
    """Steps that ran to their end with no checkpoint, or a checkpoint of another attempt."""
    unrecovered: int = 0
    recovery_s: list[float] = field(default_factory=list)
    twice: list[str] = field(default_factory=list)
    """For each execution ``ran_twice`` counts: its key, its runs and the checkpoint, so that a
    failed drill names what ran again."""

    @property
    def doubled(self) -> int:
        return self.concurrent + self.ran_twice

    def assert_exactly_once(self) -> None:
        """What every scenario holds each step to, past the kills and outages ``examine``
        excuses: its checkpoint and what follows it happened once."""
        assert self.concurrent == 0, "a step ran in two copies at once"
        assert self.ran_twice == 0, (
            "a step ran to its end again after another one's checkpoint: " + "; ".join(self.twice)
        )
        assert self.unmatched == 0, "a step ran to its end but its checkpoint is of another run"


def executions(counters: redis.Redis, job_ids: Iterable[uuid.UUID]) -> dict[str, list[Execution]]:
    """Per ``chaos:<job>:<step>:<tail>`` key, its executions in the order they started."""
    found: dict[str, list[Execution]] = {}
    for job_id in job_ids:
        for key in counters.scan_iter(f"chaos:{job_id}:*", count=1000):
            runs: list[Execution] = []
            for raw in counters.lrange(key, 0, -1):
                record = json.loads(raw)
                if record["e"] == "start":
                    runs.append(Execution(record["pid"], record["attempt"], record["t"]))
                    continue
                open_runs = [r for r in runs if r.pid == record["pid"] and r.end is None]
                if open_runs:
                    open_runs[-1].end = record["t"]
            found[key.decode()] = runs
    return found


def checkpoints(client: Client, job_ids: list[uuid.UUID]) -> dict[str, Checkpoint]:
    """What PostgreSQL kept, under the keys ``drill.work`` records under: a step's or item's
    checkpoint, a finished loop round (the last round's is its step's checkpoint) and a completed
    compensation."""
    from sqlalchemy import select

    from service.platform.db import unit_of_work
    from service.platform.models import CompensationRow, StepRoundRow, StepRunRow

    kept: dict[str, Checkpoint] = {}
    with unit_of_work(client.rt.sessions) as session:
        steps = session.execute(
            select(
                StepRunRow.job_id,
                StepRunRow.step_id,
                StepRunRow.shard,
                StepRunRow.attempts,
                StepRunRow.finished_at,
                StepRunRow.round,
            ).where(StepRunRow.job_id.in_(job_ids), StepRunRow.output.is_not(None))
        )
        for job, step, shard, attempt, at, round_ in steps:
            assert at is not None, "a checkpointed step has its end"
            kept[f"chaos:{job}:{step}:{shard}"] = Checkpoint(attempt, at.timestamp())
            if shard == -1:
                kept[f"chaos:{job}:{step}:r{round_}"] = Checkpoint(attempt, at.timestamp())
        rounds = session.execute(
            select(
                StepRoundRow.job_id,
                StepRoundRow.step_id,
                StepRoundRow.round,
                StepRoundRow.attempts,
                StepRoundRow.finished_at,
            ).where(StepRoundRow.job_id.in_(job_ids), StepRoundRow.status == "succeeded")
        )
        for job, step, round_, attempts, ended in rounds:
            assert ended is not None, "a succeeded round has its end"
            kept[f"chaos:{job}:{step}:r{round_}"] = Checkpoint(attempts, ended.timestamp())
        undone = session.execute(
            select(
                CompensationRow.job_id,
                CompensationRow.step_id,
                CompensationRow.attempts,
                CompensationRow.finished_at,
            ).where(CompensationRow.job_id.in_(job_ids), CompensationRow.status == "compensated")
        )
        for job, step, attempts, done in undone:
            assert done is not None, "a completed compensation has its end"
            kept[f"chaos:{job}:{step}:undo"] = Checkpoint(attempts, done.timestamp())
    return kept


def examine(
    runs_by_key: Mapping[str, list[Execution]],
    kept: Mapping[str, Checkpoint],
    killed: Mapping[int, float],
    *,
    orphaned: Mapping[int, float] | None = None,
    outages: Sequence[tuple[float, float]] = (),
) -> Findings:
    """Check every step's executions against its checkpoint; each execution a kill cut short is
    measured until its step starts again. ``orphaned`` are pool processes whose worker's main
    process was killed (at the time given): what they were running must end there or start
    again elsewhere. An execution that ended within one of the ``outages`` (from, to) of the
    database may have found no database to checkpoint in, as one whose process was killed."""
    orphans = orphaned or {}
    findings = Findings()
    for key, runs in runs_by_key.items():
        before = findings.ran_twice
        _against_checkpoint(runs, kept.get(key), killed, outages, findings)
        if findings.ran_twice > before:
            findings.twice.append(f"{key}: runs {runs}, checkpoint {kept.get(key)}")
        for i, run in enumerate(runs):
            stopped = run.end if run.end is not None else killed.get(run.pid, float("inf"))
            later = runs[i + 1 :]
            findings.concurrent += sum(other.start < stopped for other in later)
            cut_at = _cut_short(run, killed, orphans)
            if cut_at is None:
                continue
            again = [other.start for other in later if other.start >= cut_at]
            if run.end is not None:
                findings.recovery_s.append(run.end - cut_at)
            elif again:
                findings.recovery_s.append(again[0] - cut_at)
            else:
                findings.unrecovered += 1
    return findings


def _cut_short(
    run: Execution, killed: Mapping[int, float], orphans: Mapping[int, float]
) -> float | None:
    """When the run's process was killed, or orphaned, while the run was going on."""
    if run.pid in killed:
        return killed[run.pid] if run.end is None else None
    at = orphans.get(run.pid)
    if at is None or run.start > at or (run.end is not None and run.end < at):
        return None
    return at


def _against_checkpoint(
    runs: list[Execution],
    checkpoint: Checkpoint | None,
    killed: Mapping[int, float],
    outages: Sequence[tuple[float, float]],
    findings: Findings,
) -> None:
    ended = [run for run in runs if run.end is not None]
    if not ended:
        return
    last = max(ended, key=lambda run: run.end or 0.0)
    if checkpoint is None or checkpoint.attempt != last.attempt:
        findings.unmatched += 1
    for run in ended:
        if run is last:
            continue
        end = run.end or 0.0
        if killed.get(run.pid, float("-inf")) >= end or any(a <= end <= b for a, b in outages):
            findings.reruns += 1
        else:
            findings.ran_twice += 1
    if checkpoint is not None:
        findings.ran_twice += sum(run.start > checkpoint.at for run in runs)
