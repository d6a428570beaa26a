"""``flowbeat flower``: refused without credentials, behind basic auth once started, and
showing a running job's step by its pipeline, step and job rather than bare ids."""

import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, expect
from playwright.sync_api import Error as PlaywrightError

from service.platform.constants import QUEUE_STEPS
from tasks.queues import queue_lists
from tests.conftest import Stack
from tests.e2e.conftest import Client, Cluster, Proc, needs_chromium, wait_for

ROOT = Path(__file__).resolve().parents[2]
USER, PASSWORD = "ops", "correct-horse"


def _flowbeat_env(stack: Stack, **extra: str) -> dict[str, str]:
    env = {**os.environ, **stack.env, "PYTHONPATH": str(ROOT)}
    env.pop("FLOWBEAT_FLOWER_BASIC_AUTH", None)
    return {**env, **extra}


def _refusal(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", "flower", *args],
        env=_flowbeat_env(stack, FLOWER_UNAUTHENTICATED_API="true"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_flower_refuses_to_start_without_credentials_unless_on_loopback(stack: Stack) -> None:
    for args in (["--address", "0.0.0.0"], ["--address", "0.0.0.0", "--unauthenticated"], []):
        refused = _refusal(stack, "--port", "1", *args)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "flower_auth_required" in refused.stdout
    malformed = subprocess.run(
        [sys.executable, "-m", "service.cli", "flower"],
        env=_flowbeat_env(stack, FLOWBEAT_FLOWER_BASIC_AUTH="nopassword"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert malformed.returncode == 2
    assert "settings_invalid" in malformed.stdout


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def flower(stack: Stack, cluster: Cluster, tmp_path: Path) -> Iterator[str]:
    port = _free_port()
    env = _flowbeat_env(
        stack, FLOWBEAT_FLOWER_BASIC_AUTH=f"{USER}:{PASSWORD}", FLOWER_UNAUTHENTICATED_API="1"
    )
    argv = [sys.executable, "-m", "service.cli", "flower", "--port", str(port)]
    proc = Proc(argv, env, tmp_path / "flower.log")
    cluster.procs.append(proc)
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: _answers(f"{base}/healthcheck") or proc.popen.poll() is not None, 60, "Flower")
    assert proc.popen.poll() is None, proc.output()[-3000:]
    assert PASSWORD not in " ".join(argv)
    yield base


def test_flower_answers_only_with_credentials(flower: str) -> None:
    for path in ("/", "/workers", "/api/tasks", "/api/workers"):
        assert httpx.get(f"{flower}{path}").status_code == 401, path
        assert httpx.get(f"{flower}{path}", auth=(USER, "wrong")).status_code == 401, path
    assert httpx.get(f"{flower}/", auth=(USER, PASSWORD)).status_code == 200
    assert httpx.get(f"{flower}/api/tasks", auth=(USER, PASSWORD)).status_code == 200


def _tasks(flower: str) -> dict[str, Any]:
    answer = httpx.get(f"{flower}/api/tasks", auth=(USER, PASSWORD), timeout=10)
    assert answer.status_code == 200
    tasks: dict[str, Any] = answer.json()
    return tasks


def _step_task(flower: str, job_id: uuid.UUID, name: str) -> dict[str, Any] | None:
    for task in _tasks(flower).values():
        if task.get("name") == name and str(job_id) in str(task.get("args")):
            return dict(task)
    return None


def _step_task_seen(
    flower: str, client: Client, job_id: uuid.UUID, name: str, running: bool = False
) -> dict[str, Any]:
    """The step's task once Flower shows it (``running``: as started), or a failure that says
    where the job's steps were and which tasks Flower had, so a miss can be told apart from a
    step that never ran."""

    def seen() -> dict[str, Any] | None:
        found = _step_task(flower, job_id, name)
        return found if found and (not running or found.get("state") == "STARTED") else None

    try:
        task: dict[str, Any] = wait_for(seen, 60, f"{name} in Flower")
    except AssertionError as missed:
        steps = {s.step_id: s.status for s in client.view(job_id).steps}
        names = sorted({str(t.get("name")) for t in _tasks(flower).values()})
        where = f"the job's steps: {steps}; Flower's tasks: {names}"
        raise AssertionError(f"{missed}; {where}") from missed
    return task


def _events_flow(flower: str, client: Client) -> bool:
    """Flower subscribes to the events a little after it answers: a job whose first step it
    sees ran after that."""
    probe = client.submit("dag", items=[1])
    client.wait_final(probe)
    return _step_task(flower, probe, "dag/start") is not None


def test_a_running_jobs_step_shows_in_flower_by_pipeline_step_and_job(
    flower: str, cluster: Cluster, client: Client
) -> None:
    client.broker.delete(*queue_lists(QUEUE_STEPS))
    cluster.worker(task_events="true")
    wait_for(lambda: _events_flow(flower, client), 90, "Flower to see the worker's events")

    job_id = client.submit("slow", hold_s=30)

    task = _step_task_seen(flower, client, job_id, "slow/slow", running=True)
    assert client.view(job_id).job.status == "running"
    assert task["args"] == f"job={job_id} step=slow"
    client.cancel(job_id)


@needs_chromium
def test_a_person_logs_into_flower_and_finds_the_running_jobs_task(
    flower: str, cluster: Cluster, client: Client, browser: Browser
) -> None:
    client.broker.delete(*queue_lists(QUEUE_STEPS))
    cluster.worker(task_events="true")
    wait_for(lambda: _events_flow(flower, client), 90, "Flower to see the worker's events")
    job_id = client.submit("slow", hold_s=30)
    task = _step_task_seen(flower, client, job_id, "slow/slow")

    with pytest.raises(PlaywrightError, match="ERR_INVALID_AUTH_CREDENTIALS"):
        browser.new_page().goto(f"{flower}/tasks")
    context = browser.new_context(http_credentials={"username": USER, "password": PASSWORD})
    page = context.new_page()
    page.goto(f"{flower}/tasks")
    expect(page.locator("#tasks-table")).to_contain_text("slow/slow", timeout=30_000)
    page.goto(f"{flower}/task/{task['uuid']}")
    expect(page.locator("body")).to_contain_text(f"job={job_id} step=slow")
    expect(page.locator("body")).to_contain_text("STARTED")
    client.cancel(job_id)
