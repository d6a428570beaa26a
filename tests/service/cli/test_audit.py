"""The CLI in the audit trail, run as a user runs it: each change a command makes records one
event naming the OS user, the owner it acts as and the command; a refused command records
nothing; ``flowbeat audit`` filters the trail, as tab-separated rows in a pipe or as JSON."""

import getpass
import json
import re
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from service.engine.claims import claim_step
from service.engine.runtime import Runtime
from service.engine.steps import StepKey
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from service.platform.models import AuditEventRow
from tests.support.cli import run_cli

PARKED = """\
name: parked
steps:
  - {id: gate, action: noop, approval: {timeout_s: 3600}}
  - {id: hold, action: noop, wait_for: {signal: go}}
"""

Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def owner() -> str:
    return f"cli-audit-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def import_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("imports")


@pytest.fixture(scope="module")
def flowbeat(
    stack: Any, owner: str, import_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Cli:
    env = {**stack.env, "COLUMNS": "80"}
    env["FLOWBEAT_DATA_DIR"] = str(tmp_path_factory.mktemp("cli-audit"))
    env["FLOWBEAT_CLI_OWNER"] = owner
    env["FLOWBEAT_IMPORT_DIR"] = str(import_dir)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(args, env)

    return run


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def trail(rt: Runtime, owner: str) -> list[tuple[str, str, str]]:
    """(action, target, command) of the owner's events, oldest first; all by this OS user."""
    with rt.sessions() as session:
        rows = list(
            session.scalars(
                select(AuditEventRow).where(AuditEventRow.owner == owner).order_by(AuditEventRow.id)
            )
        )
    assert {(row.channel, row.actor) for row in rows} <= {("cli", getpass.getuser())}
    return [(row.action, f"{row.target_kind}:{row.target_id}", row.source) for row in rows]


def _submitted(flowbeat: Cli, target: str, *args: str) -> str:
    [job_id] = re.findall(r"job (\S+) queued", ok(flowbeat("run", target, "--no-wait", *args)))
    return str(job_id)


def _park(rt: Runtime, job_id: str, step_id: str) -> None:
    """As a worker's claim leaves a gated or waiting step: parked."""
    with unit_of_work(rt.sessions) as session:
        key = StepKey(uuid.UUID(job_id), step_id)
        assert claim_step(session, key, task_id="t", lease_s=30, now=utcnow()) is None


def test_job_commands_record_themselves(
    flowbeat: Cli, runtime: Runtime, owner: str, tmp_path: Path
) -> None:
    profile = tmp_path / "parked.yaml"
    profile.write_text(PARKED)
    job = _submitted(flowbeat, str(profile))
    _park(runtime, job, "gate")
    ok(flowbeat("jobs", "approve", job, "gate", "--by", "alice"))
    _park(runtime, job, "hold")
    ok(flowbeat("jobs", "signal", job, "go"))
    ok(flowbeat("jobs", "cancel", job))
    ok(flowbeat("jobs", "cancel", job))  # already cancelled: no change, no event
    rerun = ok(flowbeat("jobs", "rerun", job))
    [new_job] = re.findall(r"job (\S+) queued", rerun)
    refused = flowbeat("jobs", "reject", job, "gate")
    _park(runtime, new_job, "gate")
    ok(flowbeat("jobs", "reject", new_job, "gate"))

    assert refused.returncode == 2
    assert trail(runtime, owner) == [
        ("job.submit", f"job:{job}", "flowbeat run"),
        ("job.approve", f"job:{job}", "flowbeat jobs approve"),
        ("job.signal", f"job:{job}", "flowbeat jobs signal"),
        ("job.cancel", f"job:{job}", "flowbeat jobs cancel"),
        ("job.rerun", f"job:{job}", "flowbeat jobs rerun"),
        ("job.reject", f"job:{new_job}", "flowbeat jobs reject"),
    ]


def test_pipeline_schedule_and_key_commands_record_themselves(
    flowbeat: Cli, runtime: Runtime, owner: str, tmp_path: Path, import_dir: Path
) -> None:
    """``--owner`` names whose pipeline and key; ``keys revoke`` takes none and acts as the
    command's default owner."""
    other = f"cli-keys-{uuid.uuid4().hex[:6]}"
    name = f"p-{uuid.uuid4().hex[:6]}"
    file = tmp_path / "p.yaml"
    file.write_text(f"name: {name}\nsteps:\n  - {{id: a, action: noop}}\n")
    (import_dir / "p.yaml").write_text(f"name: {name}\nsteps:\n  - {{id: b, action: noop}}\n")
    mine = ("--owner", other)
    ok(flowbeat("pipelines", "save", str(file), *mine))
    ok(flowbeat("pipelines", "save", str(file), *mine))  # unchanged: no new version, no event
    ok(flowbeat("pipelines", "import", "--path", "p.yaml", *mine))
    ok(flowbeat("schedules", "set", name, "--cron", "0 * * * *", *mine))
    ok(flowbeat("schedules", "pause", name, *mine))
    ok(flowbeat("schedules", "pause", name, *mine))  # already paused: no event
    ok(flowbeat("schedules", "resume", name, *mine))
    ok(flowbeat("schedules", "delete", name, *mine))
    ok(flowbeat("pipelines", "delete", name, *mine))
    key = ok(flowbeat("keys", "create", "--scopes", "read", *mine)).strip()
    ok(flowbeat("keys", "revoke", key))
    refused = flowbeat("keys", "revoke", key)

    prefix = key.split("_")[1]
    events = trail(runtime, other)
    schedule = events[2][1]
    assert refused.returncode == 2
    assert [(action, target) for action, target, _ in events] == [
        ("pipeline.save", f"pipeline:{name}"),
        ("pipeline.import", f"pipeline:{name}"),
        ("schedule.create", schedule),
        ("schedule.pause", schedule),
        ("schedule.resume", schedule),
        ("schedule.delete", schedule),
        ("pipeline.delete", f"pipeline:{name}"),
        ("key.create", f"key:{prefix}"),
    ]
    assert events[3][2] == "flowbeat schedules pause"
    revoked = [e for e in trail(runtime, owner) if e[1] == f"key:{prefix}"]
    assert revoked == [("key.revoke", f"key:{prefix}", "flowbeat keys revoke")]
    assert key not in json.dumps(events + revoked)


def test_flowbeat_audit_filters_through_a_pipe_and_as_json(
    flowbeat: Cli, owner: str, tmp_path: Path
) -> None:
    profile = tmp_path / "one.yaml"
    profile.write_text("name: one\nsteps:\n  - {id: a, action: noop}\n")
    job = _submitted(flowbeat, str(profile))
    ok(flowbeat("jobs", "cancel", job))

    table = ok(flowbeat("audit", "--target", f"job:{job}"))
    documents = json.loads(ok(flowbeat("audit", "--target", f"job:{job}", "--json")))
    paged = json.loads(ok(flowbeat("audit", "--actor", owner, "--limit", "1", "--json")))
    bad = flowbeat("audit", "--since", "yesterday")

    rows = [line.split("\t") for line in table.splitlines()[1:]]
    assert [row[3:] for row in rows] == [["job.cancel", f"job:{job}"], ["job.submit", f"job:{job}"]]
    assert "flowbeat" not in table
    assert [e["action"] for e in documents["events"]] == ["job.cancel", "job.submit"]
    assert documents["events"][0]["source"] == "flowbeat jobs cancel"
    assert len(paged["events"]) == 1 and paged["next_cursor"]
    assert bad.returncode == 2 and "--since" in bad.stdout + bad.stderr
