"""What a cluster scenario survived, as one row of the cluster table of docs/guarantees.md.

Each scenario appends its row to the file ``FLOWBEAT_CLUSTER_RESULTS`` names (``make cluster``
sets it); ``python -m tests.cluster.results RESULTS docs/guarantees.md`` writes the rows between
``<!-- cluster:begin -->`` and ``<!-- cluster:end -->``, replacing the rows of the same
scenarios and keeping the others, as the chaos table is written.
"""

import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

BEGIN, END = "<!-- cluster:begin -->", "<!-- cluster:end -->"
HEADER = (
    "| scenario | fault | jobs | lost | doubled | re-run | recovery p50 / max | took |\n"
    "|---|---|---|---|---|---|---|---|"
)


@dataclass(frozen=True)
class Row:
    scenario: str
    fault: str
    jobs: int
    lost: int
    doubled: int
    reruns: int
    recovery_p50_s: float | None
    recovery_max_s: float | None
    took_s: float


def record(
    scenario: str,
    fault: str,
    *,
    jobs: int,
    lost: int,
    doubled: int,
    reruns: int,
    recovery_s: list[float],
    started: float,
) -> Row:
    """``started``: the scenario's ``time.monotonic()`` at its start, for its duration."""
    row = Row(
        scenario,
        fault,
        jobs,
        lost,
        doubled,
        reruns,
        round(statistics.median(recovery_s), 1) if recovery_s else None,
        round(max(recovery_s), 1) if recovery_s else None,
        round(time.monotonic() - started, 1),
    )
    target = os.environ.get("FLOWBEAT_CLUSTER_RESULTS")
    if target:
        with Path(target).open("a") as out:
            out.write(json.dumps(asdict(row)) + "\n")
    return row


def _seconds(value: object) -> str:
    return "—" if value is None else f"{value} s"


def line(row: dict[str, object]) -> str:
    recovery = f"{_seconds(row['recovery_p50_s'])} / {_seconds(row['recovery_max_s'])}"
    return (
        f"| {row['scenario']} | {row['fault']} | {row['jobs']} | {row['lost']} "
        f"| {row['doubled']} | {row['reruns']} | {recovery} | {row['took_s']} s |"
    )


def table(rows: list[dict[str, object]], standing: str) -> str:
    kept = {r.split("|")[1].strip(): r for r in standing.splitlines()[2:] if r.startswith("| ")}
    for row in rows:
        kept[str(row["scenario"])] = line(row)
    return "\n".join([HEADER, *kept.values()])


def main(argv: list[str]) -> int:
    results, page = Path(argv[0]), Path(argv[1])
    rows = [json.loads(text) for text in results.read_text().splitlines() if text.strip()]
    text = page.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    written = table(rows, text[start:end].strip())
    page.write_text(f"{text[:start]}\n{written}\n{text[end:]}")
    print(written)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
