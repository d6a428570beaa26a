"""``flowbeat jobs logs ID [STEP]``: what a job's steps logged and printed, on a terminal or as
JSON, one attempt's on request, and followed until the job ends with ``--follow``."""

import json
import re
import subprocess
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from service.engine.runner import run_step
from service.engine.runtime import Runtime
from service.engine.steps import StepKey
from service.platform.errors import RetryLater
from tests.conftest import Stack
from tests.support.cli import run_cli, run_process
from tests.support.fanouts import submitted

Cli = Callable[..., subprocess.CompletedProcess[str]]

TWO_STEPS: dict[str, Any] = {
    "name": "chatty",
    "steps": [
        {
            "id": "first",
            "action": "drill.chatter",
            "with": {"fail_attempts": 1},
            "retry": {"attempts": 2, "backoff_s": 0, "jitter": 0},
        },
        {"id": "second", "action": "drill.chatter", "depends_on": ["first"]},
    ],
}


@pytest.fixture(scope="module")
def flowbeat(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Cli:
    env = {**stack.env, "COLUMNS": "200"}
    env["FLOWBEAT_DATA_DIR"] = str(tmp_path_factory.mktemp("cli-data"))

    def run(*args: str, process: bool = False) -> subprocess.CompletedProcess[str]:
        """In the test process (``tests.support.cli``), unless ``process`` asks for one."""
        return run_process(args, env) if process else run_cli(args, env)

    return run


def _attempts(rt: Runtime, job_id: uuid.UUID) -> None:
    with pytest.raises(RetryLater):
        run_step(rt, StepKey(job_id, "first"), task_id=uuid.uuid4().hex)
    run_step(rt, StepKey(job_id, "first"), task_id=uuid.uuid4().hex)
    run_step(rt, StepKey(job_id, "second"), task_id=uuid.uuid4().hex)


def test_every_step_s_lines_by_a_short_id_then_one_step_s_one_attempt(
    flowbeat: Cli, runtime: Runtime
) -> None:
    job_id = submitted(runtime, TWO_STEPS, {})
    _attempts(runtime, job_id)

    every = flowbeat("jobs", "logs", str(job_id)[:8])
    one = flowbeat("jobs", "logs", str(job_id), "first", "--attempt", "2", "--json")

    assert every.returncode == 0, every.stdout + every.stderr
    rows = re.findall(r"^\d\d:\d\d:\d\d\.\d{3} (\w+)\s+(\S+ #\d) (.*)$", every.stdout, re.M)
    assert rows == [
        ("INFO", "first #1", "ctx line 1 of attempt 1"),
        ("WARNING", "first #1", "logger line 1"),
        ("INFO", "first #1", "printed line 1"),
        ("INFO", "first #2", "ctx line 1 of attempt 2"),
        ("WARNING", "first #2", "logger line 1"),
        ("INFO", "first #2", "printed line 1"),
        ("INFO", "second #1", "ctx line 1 of attempt 1"),
        ("WARNING", "second #1", "logger line 1"),
        ("INFO", "second #1", "printed line 1"),
    ]
    assert one.returncode == 0, one.stdout + one.stderr
    lines = json.loads(one.stdout)["lines"]
    assert [(line["step_id"], line["attempt"]) for line in lines] == [("first", 2)] * 3


@pytest.mark.e2e  # runs the command as a process while its steps run in a thread here
def test_follow_prints_lines_as_they_come_and_exits_when_the_job_ends(
    flowbeat: Cli, runtime: Runtime
) -> None:
    job_id = submitted(runtime, TWO_STEPS, {})
    worker = threading.Timer(2.0, _attempts, args=(runtime, job_id))
    worker.start()
    try:
        followed = flowbeat(
            "jobs", "logs", str(job_id), "second", "--follow", "--json", process=True
        )
    finally:
        worker.join()

    assert followed.returncode == 0, followed.stdout + followed.stderr
    lines = [json.loads(raw) for raw in followed.stdout.splitlines()]
    assert [line["message"] for line in lines] == [
        "ctx line 1 of attempt 1",
        "logger line 1",
        "printed line 1",
    ]


def test_a_step_the_job_lacks_is_refused_with_its_code(
    flowbeat: Cli, runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    job_id = submitted(runtime, TWO_STEPS, {})
    leftovers.append(job_id)

    done = flowbeat("jobs", "logs", str(job_id), "third")

    assert done.returncode == 2
    assert "step_not_found:" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
