"""CPU time of a bench's own processes, read from ``/proc``.

Throughput on a shared or throttled VM swings with whatever else runs; the CPU a side spends
per unit of work barely does. So the chain bench reads, besides its rates, the CPU time of
each part of each side over the timed section: the processes it started (with their pool
children), the PostgreSQL backends connected to its database, and its own process (the load
generator, or raw Celery's client). Redis is one server shared with everything else on the
machine, so its time is not attributable to one side and is left out.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg

TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def descendants(pid: int) -> list[int]:
    """``pid``'s children, their children, and so on."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(int(entry))) is not None:
            parents.setdefault(int(fields[1]), []).append(int(entry))
    found, pending = [], [pid]
    while pending:
        for child in parents.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found


def cpu_s(pid: int) -> float | None:
    """User and system time of ``pid``, with that of its children already reaped; ``None``
    for a process that is gone."""
    fields = _stat(pid)
    return None if fields is None else sum(int(x) for x in fields[11:15]) / TICKS_PER_S


def database_backends(conn: psycopg.Connection[Any]) -> list[int]:
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid()"
    ).fetchall()
    return [int(row[0]) for row in rows]


@dataclass
class CpuMeter:
    """CPU seconds per part between ``start`` and ``stop``. A part is a list of root processes
    with their descendants, ``postgres`` (the backends on ``database``'s database) and
    ``client`` (this process). Each process counts from when it was first seen, so a pool
    process or a backend started during the section counts from its start; one gone by the
    stop counts nothing."""

    roots: dict[str, list[int]] = field(default_factory=dict)
    database: psycopg.Connection[Any] | None = None
    _start: dict[str, dict[int, float]] = field(default_factory=dict)
    _client_start: float = 0.0

    def _pids(self, part: str) -> list[int]:
        if part == "postgres":
            return database_backends(self.database) if self.database else []
        return sorted({p for root in self.roots[part] for p in (root, *descendants(root))})

    def _parts(self) -> list[str]:
        return [*self.roots, *(["postgres"] if self.database else [])]

    def _read(self, part: str) -> dict[int, float]:
        return {pid: t for pid in self._pids(part) if (t := cpu_s(pid)) is not None}

    def start(self) -> None:
        self._start = {part: self._read(part) for part in self._parts()}
        self._client_start = time.process_time()

    def stop(self) -> dict[str, float]:
        spent = {"client": time.process_time() - self._client_start}
        for part in self._parts():
            before = self._start[part]
            spent[part] = sum(t - before.get(pid, 0.0) for pid, t in self._read(part).items())
        return spent


def pss_kib(pid: int) -> int:
    """0 for a process that is gone: a pool process may be replaced between two readings."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0
