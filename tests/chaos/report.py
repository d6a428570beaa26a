"""Write the faults-survived table of a ``make chaos FULL=1`` run into the docs' guarantees page.

    python -m tests.chaos.report RESULTS docs/guarantees.md

The rows of the run replace the rows of the same scenarios between ``<!-- chaos:begin -->`` and
``<!-- chaos:end -->``, in place; the rows of scenarios the run left out stay, and a new
scenario's row is added at the end. So a run of some scenarios (``-k``) updates only theirs.
"""

import json
import sys
from pathlib import Path

BEGIN, END = "<!-- chaos:begin -->", "<!-- chaos:end -->"


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f} s"


HEADER = (
    "| scenario | faults injected | jobs | lost | doubled | re-run | recovery p50 / p99 | scale |\n"
    "|---|---|---|---|---|---|---|---|"
)


def line(row: dict[str, object]) -> str:
    recovery = f"{_seconds(row['recovery_p50_s'])} / {_seconds(row['recovery_p99_s'])}"  # type: ignore[arg-type]
    return (
        f"| {row['scenario']} | {row['faults']} | {row['jobs']} | {row['lost']} "
        f"| {row['doubled']} | {row['reruns']} | {recovery} | {row['scale']} |"
    )


def table(rows: list[dict[str, object]], standing: str = "") -> str:
    """``standing``: the table as it stands, whose rows of other scenarios are kept."""
    lines = {_scenario(kept): kept for kept in standing.splitlines()[2:] if kept.startswith("| ")}
    for row in rows:
        lines[str(row["scenario"])] = line(row)
    return "\n".join([HEADER, *lines.values()])


def _scenario(kept: str) -> str:
    return kept.split("|")[1].strip()


def main(argv: list[str]) -> int:
    results, page = Path(argv[0]), Path(argv[1])
    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    text = page.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    written = table(rows, text[start:end].strip())
    page.write_text(f"{text[:start]}\n{written}\n{text[end:]}")
    print(written)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
