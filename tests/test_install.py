"""The built wheel installs into a fresh virtualenv and runs the embedded demo from any directory.

Nothing is downloaded: the wheel is built with the build backend of the project's environment
(no build isolation) and installed with ``--no-index``. The fresh environment sees the project's
dependencies through a ``.pth`` line written only after the install, so pip never sees the
project's own editable flowbeat, and a ``.pth`` line does not run the editable finder that sits
in that directory; the first test proves that flowbeat is imported from the wheel.
"""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [
    "service",
    "tasks",
    "scheduler",
    "api",
    "profiles",
    "flowbeat_client",
    "pyproject.toml",
    "README.md",
]
PACKAGES = ["service", "tasks", "scheduler", "api", "profiles", "flowbeat_client"]
DEMO_TIMEOUT_S = 180
STOP_TIMEOUT_S = 60

pytestmark = [pytest.mark.install, pytest.mark.timeout(360)]


def _run(
    argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, check=False, cwd=cwd, env=env, timeout=120
    )


def _offline_pip() -> dict[str, str]:
    return {**os.environ, "PIP_NO_INDEX": "1"}


def _wheel(tmp: Path) -> Path:
    """Built from a copy of the sources, so the checkout gets no build or egg-info directory."""
    source = tmp / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in SOURCES:
        origin = ROOT / name
        if origin.is_dir():
            shutil.copytree(origin, source / name, ignore=ignore)
        else:
            shutil.copy2(origin, source / name)
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    built = _run([*pip, "-w", str(tmp), str(source)], env=_offline_pip())
    assert built.returncode == 0, built.stderr
    [wheel] = tmp.glob("flowbeat-*.whl")
    return wheel


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("install")
    wheel = _wheel(tmp)
    env_dir = tmp / "venv"
    assert _run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)]).returncode == 0
    python = env_dir / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps"]
    installed = _run([*pip, str(wheel)], env=_offline_pip())
    assert installed.returncode == 0, installed.stderr
    paths = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    ours = sysconfig.get_paths()
    Path(paths.stdout.strip(), "project-deps.pth").write_text(
        "".join(f"{path}\n" for path in dict.fromkeys([ours["purelib"], ours["platlib"]]))
    )
    return env_dir


def _clean_env() -> dict[str, str]:
    """The user's environment without flowbeat's settings: the embedded default, no servers."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("FLOWBEAT_") and k not in {"PYTHONPATH", "VIRTUAL_ENV"}
    }


def test_flowbeat_is_imported_from_the_wheel_with_its_profiles_schema_and_migrations(
    venv: Path, tmp_path: Path
) -> None:
    probe = f"""
import importlib, json, pathlib
from service.platform.constants import SHIPPED_DIR
from service.language.profiles import SCHEMA_PATH
service = pathlib.Path(importlib.import_module("service").__file__).parent
versions = service / "platform" / "migrations" / "versions"
api = pathlib.Path(importlib.import_module("api").__file__).parent
print(json.dumps({{
    "ui": sorted(p.name for p in [*api.glob("templates/*"), *api.glob("static/*")]),
    "files": {{name: importlib.import_module(name).__file__ for name in {PACKAGES!r}}},
    "shipped": str(SHIPPED_DIR),
    "profiles": sorted(p.name for p in SHIPPED_DIR.glob("*.yaml")),
    "schema": str(SCHEMA_PATH) if SCHEMA_PATH.is_file() else None,
    "data": (SHIPPED_DIR / "data" / "papers.jsonl").is_file(),
    "migrations": len(list(versions.glob("0*.py"))),
}}))
"""
    done = _run([str(venv / "bin" / "python"), "-c", probe], cwd=tmp_path, env=_clean_env())

    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    site = str(venv / "lib")
    for name, file in found["files"].items():
        assert file.startswith(site) and not file.startswith(str(ROOT) + "/"), (name, file)
    assert found["shipped"].startswith(site)
    assert {"papers-digest.yaml", "review-loop.yaml"} <= set(found["profiles"])
    assert found["schema"] == str(Path(found["shipped"]) / "profile.schema.json")
    assert found["data"] is True
    assert found["migrations"] >= 10
    assert {"job.html", "job_panel.html", "ui.css", "ui.js"} <= set(found["ui"])


def _ours(directory: Path) -> list[str]:
    """Processes working under ``directory``: the embedded servers keep their data there and
    the demo's worker runs there, so none may be left once the demo and ``stop`` are done."""
    left = []
    for proc in Path("/proc").iterdir():
        try:
            cwd = (proc / "cwd").readlink()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if cwd == directory or directory in cwd.parents:
            left.append(f"{proc.name}: {cmdline.decode(errors='replace')}")
    return left


def _run_demo(flowbeat: Path, cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    """``flowbeat run`` in its own session; on a timeout the session gets SIGTERM, which makes
    the command stop the worker it started, then SIGKILL."""
    with subprocess.Popen(
        [str(flowbeat), "run", "papers-digest"],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    ) as demo:
        try:
            output, _ = demo.communicate(timeout=DEMO_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(demo.pid, signal.SIGTERM)
            try:
                output, _ = demo.communicate(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(demo.pid, signal.SIGKILL)
                output, _ = demo.communicate()
            pytest.fail(f"the demo did not end within {DEMO_TIMEOUT_S}s:\n{output[-3000:]}")
    return demo.returncode, output


@pytest.fixture
def workdir(venv: Path) -> Iterator[Path]:
    """An empty directory for the demo, outside pytest's temp root, which is private to root:
    the embedded PostgreSQL runs as an unprivileged user that must reach its data directory.
    The servers the demo starts there are stopped, then the directory is removed."""
    path = Path(tempfile.mkdtemp(prefix="flowbeat-demo-"))
    yield path
    stop = subprocess.run(
        [str(venv / "bin" / "flowbeat"), "stop"],
        cwd=path,
        env=_clean_env(),
        capture_output=True,
        text=True,
        check=False,
        timeout=STOP_TIMEOUT_S,
    )
    shutil.rmtree(path, ignore_errors=True)
    assert stop.returncode == 0, stop.stdout + stop.stderr


def test_the_embedded_demo_runs_from_an_empty_directory_and_stop_leaves_nothing_running(
    venv: Path, workdir: Path
) -> None:
    code, output = _run_demo(venv / "bin" / "flowbeat", workdir, _clean_env())

    assert code == 0, output[-3000:]
    assert ": succeeded" in output
    assert _ours(workdir), "the embedded servers should still run for the next command"

    stop = _run([str(venv / "bin" / "flowbeat"), "stop"], cwd=workdir, env=_clean_env())
    deadline = time.monotonic() + 10
    while _ours(workdir) and time.monotonic() < deadline:
        time.sleep(0.1)

    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert _ours(workdir) == []
