"""The embedded default's data directory full, or read-only: a command refuses with its code
and says why, prints no traceback, and leaves nothing that keeps a later start from working.

Each directory is a tmpfs of its own (this needs the privilege to mount, which root has in the
test machines; elsewhere the test says so and is skipped)."""

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.results import record

ROOT = Path(__file__).resolve().parents[2]
NO_SERVERS = ("FLOWBEAT_DATABASE_URL", "FLOWBEAT_BROKER_URL")


def _mount(target: Path, options: str) -> bool:
    target.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


@pytest.fixture
def tiny(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "tiny"
    if not _mount(mount, "size=1m"):
        pytest.skip("cannot mount a tmpfs here")
    yield mount
    subprocess.run(["flowbeat", "stop"], env=_env(mount / "fb"), capture_output=True, check=False)
    subprocess.run(["umount", "-l", str(mount)], check=False)


def _env(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in NO_SERVERS}
    return {
        **env,
        "FLOWBEAT_DATA_DIR": str(data_dir),
        "PATH": f"{Path(sys.executable).parent}:{env['PATH']}",
    }


def _jobs_list(data_dir: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "service.cli", "jobs", "list"]
    return subprocess.run(
        argv, env=_env(data_dir), cwd=ROOT, capture_output=True, text=True, timeout=180, check=False
    )


@pytest.mark.drill
@pytest.mark.timeout(300)
def test_a_full_or_read_only_data_directory_is_refused_clearly_and_harms_nothing(
    tiny: Path,
) -> None:
    full = _jobs_list(tiny / "fb")
    subprocess.run(["mount", "-o", "remount,ro", str(tiny)], check=True)
    read_only = _jobs_list(tiny / "elsewhere")
    subprocess.run(["mount", "-o", "remount,rw,size=300m", str(tiny)], check=True)
    later = _jobs_list(tiny / "fb")

    refusals = [full, read_only]
    record(
        "embedded data directory full, then read-only",
        "a 1 MiB tmpfs, then the same remounted read-only",
        0,
        sum(r.returncode != 2 for r in refusals),
        0,
        [],
    )
    for refused in refusals:
        output = " ".join((refused.stdout + refused.stderr).split())
        assert refused.returncode == 2, output[-2000:]
        assert "embedded_unavailable" in output and "Traceback" not in output
        assert "full, read-only or not writable" in output
    assert later.returncode == 0, (later.stdout + later.stderr)[-2000:]
