"""Every execution of every step (or fan-out item) of a chaos run, read back from what the
``drill.work`` action recorded, and what a run of them may not show."""

import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import redis


@dataclass
class Execution:
    pid: int
    start: float
    end: float | None = None


@dataclass
class Findings:
    completed_twice: int = 0
    concurrent: int = 0
    unrecovered: int = 0
    recovery_s: list[float] = field(default_factory=list)


def executions(counters: redis.Redis, job_ids: Iterable[uuid.UUID]) -> dict[str, list[Execution]]:
    """Per ``chaos:<job>:<step>:<shard>`` key, its executions in the order they started."""
    found: dict[str, list[Execution]] = {}
    for job_id in job_ids:
        for key in counters.scan_iter(f"chaos:{job_id}:*", count=1000):
            runs: list[Execution] = []
            for raw in counters.lrange(key, 0, -1):
                record = json.loads(raw)
                if record["e"] == "start":
                    runs.append(Execution(record["pid"], record["t"]))
                    continue
                open_runs = [r for r in runs if r.pid == record["pid"] and r.end is None]
                if open_runs:
                    open_runs[-1].end = record["t"]
            found[key.decode()] = runs
    return found


def examine(runs_by_key: Mapping[str, list[Execution]], killed: Mapping[int, float]) -> Findings:
    """A step may run again after its process was killed, never twice to the end, never two
    copies at once; each killed execution is measured until its step starts again."""
    findings = Findings()
    for runs in runs_by_key.values():
        findings.completed_twice += max(0, sum(r.end is not None for r in runs) - 1)
        for i, run in enumerate(runs):
            stopped = run.end if run.end is not None else killed.get(run.pid, float("inf"))
            later = runs[i + 1 :]
            findings.concurrent += sum(other.start < stopped for other in later)
            if run.end is None and run.pid in killed:
                again = [other.start for other in later if other.start >= killed[run.pid]]
                if again:
                    findings.recovery_s.append(again[0] - killed[run.pid])
                else:
                    findings.unrecovered += 1
    return findings
