"""The flowbeat command, run as a user runs it, against the test stack."""

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Stack

ROOT = Path(__file__).resolve().parents[2]


Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def flowbeat(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Cli:
    env = {**os.environ, **stack.env, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    env["FLOWBEAT_DATA_DIR"] = str(tmp_path_factory.mktemp("cli-data"))

    def run(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "service.cli", *args]
        return subprocess.run(
            argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, check=False
        )

    return run


def test_run_follows_the_steps_and_exits_zero_on_success(flowbeat: Cli) -> None:
    done = flowbeat("run", "dag", "-p", "items=[7, 8]", "--local-worker")

    assert done.returncode == 0, done.stdout + done.stderr
    for step in ("start", "left", "right", "fan", "join"):
        assert f"{step}" in done.stdout
    assert "(2/2 items)" in done.stdout
    assert ": succeeded" in done.stdout


def test_run_exits_non_zero_when_the_job_fails(flowbeat: Cli) -> None:
    done = flowbeat("run", "flaky", "-p", "succeed_on=9", "--local-worker")

    assert done.returncode == 1
    assert ": failed" in done.stdout
    assert "transient" in done.stdout


def test_run_refuses_bad_params_before_anything_is_stored(flowbeat: Cli) -> None:
    done = flowbeat("run", "dag", "-p", "items=notalist", "--no-wait")

    assert done.returncode == 2
    assert "params_invalid" in done.stdout


@pytest.mark.parametrize(("scopes", "ok"), [("read,write", True), ("root", False)])
def test_keys_create_prints_a_key_once(flowbeat: Cli, scopes: str, ok: bool) -> None:
    done = flowbeat("keys", "create", "--scopes", scopes, "--owner", "cli-test")

    assert (done.returncode == 0) is ok
    if ok:
        assert done.stdout.strip().startswith("fb_")


def test_jobs_list_shows_recent_jobs(flowbeat: Cli) -> None:
    flowbeat("run", "dag", "--no-wait")
    done = flowbeat("jobs", "list", "--pipeline", "dag")

    assert done.returncode == 0
    assert "dag" in done.stdout


def test_beat_check_reports_the_leader_and_fails_without_one(flowbeat: Cli, stack: Stack) -> None:
    import redis

    from service.constants import BEAT_LOCK_KEY

    client = redis.Redis.from_url(stack.broker_url)
    try:
        client.delete(BEAT_LOCK_KEY)
        assert flowbeat("beat", "--check").returncode == 1
        client.set(BEAT_LOCK_KEY, "host-1:4242:abc", px=20_000)
        done = flowbeat("beat", "--check")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "host-1:4242:abc" in done.stdout
    finally:
        client.delete(BEAT_LOCK_KEY)
        client.close()
