"""What a chaos scenario survived, as one row of the faults-survived table of docs/guarantees.md.

Each scenario appends its row to the file named by ``FLOWBEAT_CHAOS_RESULTS`` (``make chaos FULL=1``
sets it); ``python -m tests.chaos.report`` turns the rows into the table.
"""

import json
import os
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

SCALE = os.environ.get("FLOWBEAT_CHAOS_SCALE", "ci")
"""``ci`` (the reduced form ``make test`` and ``make chaos`` run) or ``full``
(``make chaos FULL=1``)."""


def scaled(ci: int, full: int) -> int:
    return full if SCALE == "full" else ci


@dataclass(frozen=True)
class Row:
    scenario: str
    faults: str
    jobs: int
    lost: int
    doubled: int
    reruns: int
    recovery_p50_s: float | None
    recovery_p99_s: float | None
    scale: str = SCALE


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


def record(
    scenario: str,
    faults: str,
    jobs: int,
    lost: int,
    doubled: int,
    recovery_s: list[float],
    reruns: int = 0,
) -> Row:
    """``doubled``: copies of a step that ran at the same time, or fires that got two jobs;
    ``reruns``: executions that ran to their end again because their checkpoint was never
    written (at least once, as promised: a step's body is not atomic with its checkpoint)."""
    row = Row(
        scenario,
        faults,
        jobs,
        lost,
        doubled,
        reruns,
        round(statistics.median(recovery_s), 2) if recovery_s else None,
        _pct(recovery_s, 0.99),
    )
    target = os.environ.get("FLOWBEAT_CHAOS_RESULTS")
    if target:
        with Path(target).open("a") as out:
            out.write(json.dumps(asdict(row)) + "\n")
    return row
