"""``flowbeat run`` and the step cache, run as a user runs it: a second run prints its step
``cached`` with the job and step it came from; ``--refresh`` runs it again."""

import re
from pathlib import Path

import pytest

from tests.service.cli.test_commands import Cli, flowbeat

pytestmark = pytest.mark.e2e  # runs the flowbeat CLI as a process, with a local worker
__all__ = ["flowbeat"]


def test_a_second_run_prints_its_step_cached_and_refresh_runs_it(
    flowbeat: Cli, tmp_path: Path
) -> None:
    profile = tmp_path / "cached.yaml"
    profile.write_text(
        "name: cached-cli\n"
        "steps:\n"
        f"  - {{id: look, action: noop, with: {{at: '{tmp_path.name}'}}, cache: {{ttl_s: 600}}}}\n"
    )
    first = flowbeat("run", str(profile), "--local-worker", "--timeout-s", "60")
    second = flowbeat("run", str(profile), "--local-worker", "--timeout-s", "60")
    again = flowbeat("run", str(profile), "--local-worker", "--timeout-s", "60", "--refresh")

    for done in (first, second, again):
        assert done.returncode == 0, done.stdout + done.stderr
    [first_id] = re.findall(r"job (\S+) queued", first.stdout)
    assert re.search(r"look\s+succeeded", first.stdout), first.stdout
    assert re.search(rf"look\s+cached from job {first_id} step look", second.stdout), second.stdout
    assert re.search(r"look\s+succeeded", again.stdout), again.stdout
