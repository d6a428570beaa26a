"""Jobs POSTed to the deployment's APIs, and what became of their steps, for the scenarios that
fault a worker host.

A host cut off or killed cannot be told to stop what it runs: an execution in flight there at
the fault is the at-least-once the README allows, whatever it does afterwards (it may run to
its end once healed, but must not get its checkpoint kept over the copy that ran elsewhere).
So those executions are set aside, each counted as re-run once its step starts again elsewhere,
and every other execution is held to exactly once by the chaos suite's ``examine``.
"""

import itertools
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import httpx

from tests.chaos.executions import Execution, Findings, checkpoints, examine, executions
from tests.cluster.deployment import Deployment
from tests.cluster.network import Host
from tests.e2e.conftest import Client


def post_jobs(
    deployment: Deployment, api: Host, key: str, count: int, **params: object
) -> list[uuid.UUID]:
    jobs = []
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=deployment.api_url(api), headers=headers, timeout=30) as http:
        for _ in range(count):
            answer = http.post("/v1/jobs", json={"pipeline": "chaos-chain", "params": params})
            assert answer.status_code == 202, answer.text
            jobs.append(uuid.UUID(answer.json()["job"]["id"]))
    return jobs


def in_flight(client: Client, jobs: list[uuid.UUID], pids: Collection[int]) -> list[str]:
    """The steps (their execution keys) running now in one of ``pids``."""
    runs = executions(client.counters, jobs)
    return [
        key
        for key, of_step in runs.items()
        if any(r.pid in pids and r.end is None for r in of_step)
    ]


def checkpointed(client: Client, jobs: list[uuid.UUID], keys: list[str], at: float) -> bool:
    """Whether each of the steps ``keys`` has a checkpoint written after ``at``."""
    kept = checkpoints(client, jobs)
    return all(key in kept and kept[key].at > at for key in keys)


@dataclass(frozen=True)
class Verdict:
    findings: Findings
    set_aside: int
    """Executions in flight on the faulted host at the fault."""
    ran_on: int
    """Of those, the ones that went on to their end after the fault (once healed)."""
    recovery_s: list[float]
    """For each, from the fault to its step starting again (or its own checkpoint)."""
    judged: dict[str, list[Execution]]
    """The executions held to exactly once: all but those set aside."""


def judge(
    client: Client, jobs: list[uuid.UUID], pids: Collection[int], at: float, until: float
) -> Verdict:
    """``pids``: the faulted host's processes; ``at`` and ``until``: when the fault began and
    ended (epoch seconds; the same for a kill). An execution there that started before the
    end counts as in flight: one claimed before a cut may note its start only after it."""
    runs = executions(client.counters, jobs)
    kept = checkpoints(client, jobs)
    rest: dict[str, list[Execution]] = {}
    recovery: list[float] = []
    set_aside = ran_on = 0
    for key, of_step in runs.items():
        cut = [r for r in of_step if r.pid in pids and r.start <= until and (r.end or until) >= at]
        set_aside += len(cut)
        ran_on += sum(r.end is not None for r in cut)
        rest[key] = [r for r in of_step if r not in cut]
        again = [r.start - at for r in rest[key] if r.start > at]
        if cut:
            mark = kept.get(key)
            recovery.append(min(again) if again else (mark.at - at if mark else float("inf")))
    return Verdict(examine(rest, kept, killed={}), set_aside, ran_on, recovery, rest)


def overlapping(runs_by_key: Mapping[str, list[Execution]]) -> dict[str, list[Execution]]:
    """The steps with two executions running at once, for a failure to name them."""
    found = {}
    for key, runs in runs_by_key.items():
        spans = sorted((r.start, r.end or float("inf")) for r in runs)
        if any(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans)):
            found[key] = runs
    return found


def after_checkpoint(client: Client, jobs: list[uuid.UUID]) -> int:
    """Executions that started after their step's checkpoint: what at least once never allows."""
    kept = checkpoints(client, jobs)
    return sum(
        run.start > kept[key].at
        for key, runs in executions(client.counters, jobs).items()
        if key in kept
        for run in runs
    )
