"""``flowbeat pipelines``: save, list, show, import and delete, run as a user runs them."""

import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Stack
from tests.support.cli import run_cli

Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def import_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("imports")


@pytest.fixture(scope="module")
def flowbeat(stack: Stack, import_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Cli:
    env = {**stack.env, "COLUMNS": "200"}
    env["FLOWBEAT_DATA_DIR"] = str(tmp_path_factory.mktemp("cli-data"))
    env["FLOWBEAT_IMPORT_DIR"] = str(import_dir)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(["pipelines", *args], env)

    return run


def profile(name: str, steps: int = 1) -> str:
    lines = [f"name: {name}", "tags: [cli]", "steps:", "  - {id: s1, action: noop}"]
    for i in range(2, steps + 1):
        lines.append(f"  - {{id: s{i}, action: noop, depends_on: [s{i - 1}]}}")
    return "\n".join(lines) + "\n"


def test_save_list_show_and_delete(flowbeat: Cli, tmp_path: Path) -> None:
    name, owner = f"cli-{uuid.uuid4().hex[:8]}", f"o-{uuid.uuid4().hex[:6]}"
    file = tmp_path / "search.yaml"
    file.write_text(profile(name))

    first = flowbeat("save", str(file), "--owner", owner)
    again = flowbeat("save", str(file), "--name", name, "--owner", owner)
    file.write_text(profile(name, steps=2))
    second = flowbeat("save", str(file), "--owner", owner)
    listed = flowbeat("list", "--tag", "cli", "--owner", owner)
    shown = flowbeat("show", name, "--version", "1", "--owner", owner)
    deleted = flowbeat("delete", name, "--purge-history", "--owner", owner)
    missing = flowbeat("show", name, "--owner", owner)

    assert first.returncode == 0 and f"{name} v1" in first.stdout, first.stderr
    assert "unchanged" in again.stdout and f"{name} v2" in second.stdout
    assert name in listed.stdout and owner in listed.stdout
    assert "id: s1" in shown.stdout and "id: s2" not in shown.stdout
    assert profile(name) in shown.stdout, "shown as saved, not re-serialised"
    assert deleted.returncode == 0 and f"deleted {name}" in deleted.stdout
    assert missing.returncode == 2 and "pipeline_not_found" in missing.stdout


def test_save_refuses_a_name_that_does_not_match(flowbeat: Cli, tmp_path: Path) -> None:
    file = tmp_path / "p.yaml"
    file.write_text(profile("right-name"))
    done = flowbeat("save", str(file), "--name", "wrong-name")
    assert done.returncode == 2 and "pipeline_name_mismatch" in done.stdout


def test_import_reads_only_inside_the_import_directory(flowbeat: Cli, import_dir: Path) -> None:
    name = f"cli-{uuid.uuid4().hex[:8]}"
    (import_dir / "team.yaml").write_text(profile(name))

    imported = flowbeat("import", "--path", "team.yaml")
    escaped = flowbeat("import", "--path", "../team.yaml")
    by_url = flowbeat("import", "--url", "https://example.org/p.yaml")

    assert imported.returncode == 0 and f"{name} v1" in imported.stdout, imported.stdout
    assert escaped.returncode == 2 and "import_path_refused" in escaped.stdout
    assert by_url.returncode == 2 and "imports_disabled" in by_url.stdout
