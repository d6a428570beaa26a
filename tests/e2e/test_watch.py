"""``flowbeat jobs watch`` and ``flowbeat run`` follow a running job live: its step lines appear
while it runs, and a fan-out step's progress bar moves as its items finish."""

import io
import re
import threading
from typing import Any

import pytest
from rich.console import Console

from service.engine.watch import follow
from tests.e2e.conftest import FINAL, Client, Cluster, wait_for

ITEMS = 30
FAN = {
    "name": "watched-fan",
    "params": {"items": {"type": "array", "default": list(range(ITEMS))}},
    "steps": [
        {"id": "first", "action": "noop"},
        {
            "id": "each",
            "action": "sleep",
            "depends_on": ["first"],
            "for_each": {"items": "${{ params.items }}", "max_parallel": 2},
            "with": {"seconds": 0.15, "result": "${{ item }}"},
        },
    ],
}
BAR = re.compile(rf"each\s+\S*\s+(\d+)/{ITEMS}")


@pytest.mark.timeout(120)
def test_following_a_running_fan_out_prints_its_steps_and_moves_its_bar_as_it_runs(
    client: Client, cluster: Cluster
) -> None:
    cluster.worker()
    console = Console(file=io.StringIO(), record=True, force_terminal=True, width=120)
    followed: dict[str, Any] = {}
    job_id = client.submit(FAN)
    watcher = threading.Thread(
        target=lambda: followed.update(status=follow(client.settings, job_id, 90, console))
    )
    watcher.start()

    def seen() -> str:
        return console.export_text(clear=False, styles=False)

    def part_done() -> list[int]:
        return [done for done in map(int, BAR.findall(seen())) if 0 < done < ITEMS]

    wait_for(lambda: re.search(r"each\s+running", seen()), 60, "the fan-out step's running line")
    assert client.view(job_id).job.status not in FINAL
    wait_for(part_done, 60, "the fan-out step's progress bar part of the way")
    assert client.view(job_id).job.status not in FINAL
    watcher.join(timeout=90)

    assert followed == {"status": "succeeded"}
    shown = seen()
    counts = [int(done) for done in BAR.findall(shown)]
    assert counts == sorted(counts) and counts[-1] == ITEMS
    assert re.search(rf"each\s+succeeded \({ITEMS}/{ITEMS} items\)", shown)
