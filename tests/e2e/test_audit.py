"""The audit trail across processes: a job submitted to a live API and cancelled with the CLI,
a pipeline saved with the CLI, then read back from the live API's ``GET /v1/audit`` (admin
only) and from ``flowbeat audit``."""

import getpass
import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx

from service.platform.auth import create_api_key
from service.platform.db import unit_of_work
from tests.e2e.conftest import ROOT, Client, Cluster


def _key(client: Client, owner: str, *scopes: str) -> str:
    with unit_of_work(client.rt.sessions) as session:
        key, _ = create_api_key(session, owner=owner, scopes=scopes)
    return key


def _flowbeat(cluster: Cluster, owner: str, *args: str) -> str:
    env = {**cluster.env, "FLOWBEAT_CLI_OWNER": owner, "COLUMNS": "80"}
    done = subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _trail(base: str, key: str, target: str) -> list[dict[str, Any]]:
    answer = httpx.get(
        f"{base}/v1/audit", params={"target": target}, headers={"Authorization": f"Bearer {key}"}
    )
    assert answer.status_code == 200, answer.text
    events: list[dict[str, Any]] = answer.json()["events"]
    return events


def test_a_cancel_and_a_save_from_the_cli_and_a_submit_to_the_api_are_one_trail(
    cluster: Cluster, client: Client, tmp_path: Path
) -> None:
    base = cluster.api()
    owner = f"e2e-audit-{uuid.uuid4().hex[:6]}"
    writer = _key(client, owner, "write")
    admin = _key(client, f"ops-{uuid.uuid4().hex[:6]}", "admin")
    body = {"pipeline": {"name": "one", "steps": [{"id": "a", "action": "noop"}]}}
    submitted = httpx.post(
        f"{base}/v1/jobs", json=body, headers={"Authorization": f"Bearer {writer}"}
    )
    assert submitted.status_code == 202, submitted.text
    job_id = submitted.json()["job"]["id"]
    name = f"saved-{uuid.uuid4().hex[:6]}"
    profile = tmp_path / "saved.yaml"
    profile.write_text(f"name: {name}\nsteps:\n  - {{id: a, action: noop}}\n")

    _flowbeat(cluster, owner, "jobs", "cancel", job_id)
    _flowbeat(cluster, owner, "pipelines", "save", str(profile))

    job_trail = _trail(base, admin, f"job:{job_id}")
    assert [(e["action"], e["channel"], e["source"]) for e in job_trail] == [
        ("job.cancel", "cli", "flowbeat jobs cancel"),
        ("job.submit", "api", "POST /v1/jobs"),
    ]
    assert job_trail[0]["actor"] == getpass.getuser()
    assert job_trail[1]["actor"] == writer.split("_")[1]
    assert {e["owner"] for e in job_trail} == {owner}
    [saved] = _trail(base, admin, f"pipeline:{name}")
    assert (saved["action"], saved["detail"]) == ("pipeline.save", {"owner": owner, "version": 1})
    refused = httpx.get(f"{base}/v1/audit", headers={"Authorization": f"Bearer {writer}"})
    assert refused.status_code == 403
    listed = json.loads(_flowbeat(cluster, owner, "audit", "--actor", owner, "--json"))
    assert [e["action"] for e in listed["events"]] == ["pipeline.save", "job.cancel", "job.submit"]
