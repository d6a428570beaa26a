"""``flowbeat dev`` and ``flowbeat run`` leave nothing behind when stopped by SIGINT or SIGTERM,
and ``flowbeat api`` writes its last lines before it exits.

Every process under the command (API, worker and its pool, beat) is recorded while it runs;
after the signal none of them may exist any more, not even as a zombie."""

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import Stack
from tests.e2e.conftest import wait_for

pytestmark = pytest.mark.e2e  # starts flowbeat dev, api and worker processes

ROOT = Path(__file__).resolve().parents[3]
SIGNALS = [signal.SIGINT, signal.SIGTERM]


def _descendants(pid: int) -> set[int]:
    children: dict[int, set[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, set()).add(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), set()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _left(pids: set[int]) -> set[int]:
    """The pids that still exist, running or as zombies."""
    return {pid for pid in pids if Path(f"/proc/{pid}").exists()}


@pytest.fixture
def env(stack: Stack, tmp_path: Path) -> Iterator[dict[str, str]]:
    yield {
        **os.environ,
        **stack.env,
        "PYTHONPATH": str(ROOT),
        "FLOWBEAT_DATA_DIR": str(tmp_path),
        "COLUMNS": "200",
    }


@pytest.fixture
def commands() -> Iterator[list[subprocess.Popen[bytes]]]:
    """The commands a test starts. Whatever a failed test left of them is killed, so that one
    failure cannot leave a worker or beat taking the next tests' jobs from the same broker."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for command in started:
        for pid in [*_descendants(command.pid), command.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        command.wait()


def _start(
    argv: list[str], env: dict[str, str], out: Path, commands: list[subprocess.Popen[bytes]]
) -> subprocess.Popen[bytes]:
    with out.open("wb") as sink:
        command = subprocess.Popen(
            [sys.executable, "-m", "service.cli", *argv],
            env=env,
            cwd=ROOT,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    commands.append(command)
    return command


def _exit_code(command: subprocess.Popen[bytes], out: Path) -> int:
    """The command's exit code; a command still running after a minute fails the test with
    its Python stacks, the one clue to where it hangs."""
    try:
        return command.wait(timeout=60)
    except subprocess.TimeoutExpired:
        stacks = subprocess.run(
            [str(Path(sys.executable).parent / "py-spy"), "dump", "--pid", str(command.pid)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        pytest.fail(f"still running a minute after the signal:\n{stacks.stdout}{out.read_text()}")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_dev_stops_every_process_it_started(
    env: dict[str, str],
    tmp_path: Path,
    sig: signal.Signals,
    commands: list[subprocess.Popen[bytes]],
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tmp_path / "dev.out"
    dev = _start(["dev", "--port", str(port)], env, out, commands)
    log = tmp_path / "dev.log"
    wait_for(
        lambda: (
            log.exists() and "ready." in log.read_text() and "beat: Starting" in log.read_text()
        ),
        60,
        "the worker and beat",
    )
    wait_for(lambda: _api_up(port), 30, "the API")
    started = _descendants(dev.pid)
    assert len(started) >= 4, started

    dev.send_signal(sig)

    assert _exit_code(dev, out) == 0, out.read_text()
    assert _left(started) == set()
    printed = out.read_text()
    assert re.search(r"admin API key", printed), printed
    assert "celery@" not in printed and "Uvicorn" not in printed, "logs on the terminal"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 0), (signal.SIGTERM, 143)])
def test_the_api_writes_its_last_lines_before_it_exits(
    env: dict[str, str],
    tmp_path: Path,
    sig: signal.Signals,
    code: int,
    commands: list[subprocess.Popen[bytes]],
) -> None:
    """The API writes its log from a thread of its own, which must finish before the process
    does: a SIGTERM that uvicorn raised again would otherwise kill it with lines queued."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tmp_path / "api.out"
    api = _start(
        ["api", "--port", str(port)], {**env, "FLOWBEAT_LOG_FORMAT": "text"}, out, commands
    )
    wait_for(lambda: _api_up(port), 60, "the API")

    api.send_signal(sig)

    assert _exit_code(api, out) == code, out.read_text()
    assert "Finished server process" in out.read_text().splitlines()[-1], out.read_text()


@pytest.mark.timeout(120)
def test_the_api_answers_while_nobody_reads_its_log(
    env: dict[str, str], commands: list[subprocess.Popen[bytes]]
) -> None:
    """Its stderr is a pipe nobody reads: the pipe fills after a few hundred access lines, and
    an API that wrote them on its event loop would stop answering there."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    api = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "api", "--port", str(port)],
        env={**env, "FLOWBEAT_LOG_FORMAT": "json"},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    commands.append(api)
    wait_for(lambda: _api_up(port), 60, "the API")

    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        answers = [client.get("/health").status_code for _ in range(800)]

    assert answers == [200] * 800


def _api_up(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_run_stops_its_worker_and_says_the_job_goes_on(
    env: dict[str, str],
    tmp_path: Path,
    sig: signal.Signals,
    commands: list[subprocess.Popen[bytes]],
) -> None:
    out = tmp_path / "run.out"
    run = _start(["run", "slow", "-p", "hold_s=60", "--local-worker"], env, out, commands)
    wait_for(lambda: re.search(r"slow\s+running", out.read_text()), 60, "the slow step to run")
    started = _descendants(run.pid)
    assert len(started) >= 2, started

    run.send_signal(sig)

    assert _exit_code(run, out) == 130, out.read_text()
    assert _left(started) == set()
    [job_id] = re.findall(r"job (\S+) queued", out.read_text())
    assert f"job {job_id} is still running" in out.read_text()
    cancelled = subprocess.run(
        [sys.executable, "-m", "service.cli", "jobs", "cancel", job_id],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert f"job {job_id}: cancelled" in cancelled.stdout, cancelled.stdout + cancelled.stderr
