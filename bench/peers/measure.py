"""What every side of ``bench.peers`` reports, and how: the figures of its chains and of its
fan-out, the peak memory of its processes, and the JSON line a peer's subprocess hands back.

Importable from both venvs: the standard library, ``bench.cpu`` and ``bench.harness`` only
(psycopg and redis, which the peers' venv has too).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.cpu import descendants, pss_kib
from bench.harness import STEPS_PER_JOB, pct

RESULT_PREFIX = "BENCH-PEERS-RESULT "
"""Marks the line of a peer's stdout that holds its figures, whatever its libraries print."""
SAMPLE_S = 0.25
FIND_EVERY = 8
KIB_PER_MIB = 1024


@dataclass
class Chains:
    jobs: int
    steps: int
    wall_s: float
    steps_per_s: float
    p50_ms: float
    p99_ms: float
    cpu_ms_per_job: dict[str, float] = field(default_factory=dict)
    peak_mib: float = 0.0


@dataclass
class FanOut:
    items: int
    wall_s: float | None
    items_per_s: float | None
    note: str = ""


@dataclass
class SideResult:
    side: str
    chains: Chains | None = None
    fanout: FanOut | None = None
    note: str = ""


def chains_result(
    jobs: int, wall_s: float, latencies_s: list[float], cpu_s: dict[str, float], peak_mib: float
) -> Chains:
    """``latencies_s``: from each job's submission to its last step's end."""
    ms = [x * 1000 for x in latencies_s]
    return Chains(
        jobs=jobs,
        steps=STEPS_PER_JOB * jobs,
        wall_s=wall_s,
        steps_per_s=STEPS_PER_JOB * jobs / wall_s,
        p50_ms=pct(ms, 0.50),
        p99_ms=pct(ms, 0.99),
        cpu_ms_per_job={part: s * 1000 / jobs for part, s in cpu_s.items()},
        peak_mib=peak_mib,
    )


def fanout_result(items: int, wall_s: float) -> FanOut:
    return FanOut(items, wall_s, items / wall_s)


def partial_fanout(items: int, done: int, started: float, timeout_s: float) -> FanOut:
    """A fan-out stopped at its timeout: the rate of the items done by then (``started``:
    ``time.perf_counter()``), and a note that it did not finish."""
    elapsed = time.perf_counter() - started
    note = (
        f"did not finish within {timeout_s:.0f} s: "
        f"{done} of {items} items done, at {done / elapsed:.0f} items/s"
    )
    return FanOut(items, None, done / elapsed, note)


class PeakPss:
    """The highest sum of the proportional set size (PSS: pages shared by forked processes are
    split among them) of ``roots`` and their descendants, sampled while the block runs. The
    client and the shared servers (PostgreSQL, Redis) are left out: what a side's own
    workers and servers hold. ``cpu_s`` is what the sampling cost the client's process,
    for the side to take off its client's CPU."""

    def __init__(self, roots: list[int]) -> None:
        self.roots = roots
        self.peak_kib = 0
        self.cpu_s = 0.0
        self._pids: set[int] = set()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self, find: bool) -> int:
        """Finding the processes walks all of /proc: done every ``FIND_EVERY`` samples only."""
        if find or not self._pids:
            self._pids = {p for root in self.roots for p in (root, *descendants(root))}
        return sum(pss_kib(pid) for pid in self._pids)

    def _run(self) -> None:
        count = 0
        while not self._done.wait(SAMPLE_S):
            count += 1
            self.peak_kib = max(self.peak_kib, self._sample(count % FIND_EVERY == 0))
        self.cpu_s = time.thread_time()

    def __enter__(self) -> PeakPss:
        self.peak_kib = self._sample(True)
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=10)
        self.peak_kib = max(self.peak_kib, self._sample(True))

    @property
    def mib(self) -> float:
        return self.peak_kib / KIB_PER_MIB


def emit(result: SideResult) -> None:
    print(RESULT_PREFIX + json.dumps(asdict(result)), flush=True)


def parse(stdout: str) -> SideResult:
    """The figures a peer's subprocess printed with ``emit``."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            raw: dict[str, Any] = json.loads(line[len(RESULT_PREFIX) :])
            chains, fanout = raw.get("chains"), raw.get("fanout")
            return SideResult(
                side=raw["side"],
                chains=Chains(**chains) if chains else None,
                fanout=FanOut(**fanout) if fanout else None,
                note=raw.get("note", ""),
            )
    raise RuntimeError("the side printed no result line")


def wait_until(done: Any, deadline: float, what: str, poll_s: float = 0.05) -> None:
    """Poll ``done()`` until it is true; ``TimeoutError`` past ``deadline`` (monotonic)."""
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not done in time")
        time.sleep(poll_s)


def peer_parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """The arguments ``bench.peers`` passes every peer's subprocess."""
    parser = argparse.ArgumentParser(prog=prog, description=doc)
    parser.add_argument("--chains", type=int, required=True)
    parser.add_argument("--fanout", type=int, required=True)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--redis-url", default="")
    parser.add_argument("--redis-pid", type=int, default=0)
    parser.add_argument("--admin-db", default="")
    parser.add_argument("--tmp", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--budget", type=float, default=60.0)
    parser.add_argument("--fanout-timeout", type=float, default=300.0)
    return parser


def broker_roots(redis_pid: int) -> dict[str, list[int]]:
    """The run's own Redis server as the broker part, where the side has one."""
    return {"broker": [redis_pid]} if redis_pid else {}
