"""Write the faults-survived table of a ``make chaos FULL=1`` run into the docs' guarantees page.

    python -m tests.chaos.report RESULTS docs/guarantees.md

The table replaces what stands between ``<!-- chaos:begin -->`` and ``<!-- chaos:end -->``.
"""

import json
import sys
from pathlib import Path

BEGIN, END = "<!-- chaos:begin -->", "<!-- chaos:end -->"


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f} s"


def table(rows: list[dict[str, object]]) -> str:
    lines = [
        "| scenario | faults injected | jobs | lost | doubled | re-run "
        "| recovery p50 / p99 | scale |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        recovery = f"{_seconds(row['recovery_p50_s'])} / {_seconds(row['recovery_p99_s'])}"  # type: ignore[arg-type]
        lines.append(
            f"| {row['scenario']} | {row['faults']} | {row['jobs']} | {row['lost']} "
            f"| {row['doubled']} | {row['reruns']} | {recovery} | {row['scale']} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    results, page = Path(argv[0]), Path(argv[1])
    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    text = page.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    page.write_text(f"{text[:start]}\n{table(rows)}\n{text[end:]}")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
