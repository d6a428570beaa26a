"""Daily operations from the command line, against the test stack with a real worker and API:
approve and reject, schedules, keys, the last run's diff, and ``--json`` for scripts."""

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.engine.submission import resolve_request
from service.language.cron import ScheduleSpec
from service.platform.auth import create_api_key
from service.platform.db import unit_of_work
from service.triggers.schedules import put_schedule
from tests.conftest import Stack
from tests.e2e.conftest import Client, Cluster, Proc, wait_for

ROOT = Path(__file__).resolve().parents[2]
GATED = """\
name: gated
steps:
  - id: ship
    action: noop
    approval: {timeout_s: 3600}
"""

Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def flowbeat(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Cli:
    env = {**os.environ, **stack.env, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    env["FLOWBEAT_DATA_DIR"] = str(tmp_path_factory.mktemp("cli-ops"))

    def run(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "service.cli", *args],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )

    return run


def _json(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def _status(flowbeat: Cli, job_id: str) -> str:
    status: str = _json(flowbeat("jobs", "show", job_id, "--json"))["job"]["status"]
    return status


def _gated_job(flowbeat: Cli, tmp_path: Path) -> str:
    profile = tmp_path / "gated.yaml"
    profile.write_text(GATED)
    submitted = flowbeat("run", str(profile), "--no-wait")
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    [job_id] = re.findall(r"job (\S+) queued", submitted.stdout)
    wait_for(lambda: _status(flowbeat, job_id) == "awaiting_approval", 60, "the gate")
    return str(job_id)


def test_approve_lets_the_gated_step_run_and_reject_fails_it(
    flowbeat: Cli, shared_worker: Proc, tmp_path: Path
) -> None:
    approved = _gated_job(flowbeat, tmp_path)
    rejected = _gated_job(flowbeat, tmp_path)

    done = flowbeat("jobs", "approve", approved, "ship", "--comment", "go", "--payload", '{"v": 1}')
    assert done.returncode == 0, done.stdout + done.stderr
    assert "approved by cli" in done.stdout
    done = flowbeat("jobs", "reject", rejected, "ship", "--by", "alice")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rejected by alice" in done.stdout

    wait_for(lambda: _status(flowbeat, approved) == "succeeded", 60, "the approved job")
    wait_for(lambda: _status(flowbeat, rejected) == "failed", 60, "the rejected job")
    again = flowbeat("jobs", "approve", approved, "ship")
    assert again.returncode == 2
    assert "already_decided" in again.stdout or "not_awaiting_approval" in again.stdout


def test_jobs_list_json_has_stable_keys(flowbeat: Cli, client: Client) -> None:
    job_id = client.submit("watchlist", papers=[])

    listed = _json(flowbeat("jobs", "list", "--pipeline", "watchlist", "--json"))

    [job] = [job for job in listed["jobs"] if job["id"] == str(job_id)]
    assert set(job) == {
        "id",
        "pipeline",
        "status",
        "trigger",
        "priority",
        "waiting_for",
        "parent_job_id",
        "params",
        "created_at",
        "started_at",
        "finished_at",
        "deadline_at",
        "error",
        "labels",
    }


def test_schedules_are_listed_paused_resumed_and_deleted(flowbeat: Cli, client: Client) -> None:
    with unit_of_work(client.rt.sessions) as session:
        profile = resolve_request(
            session,
            "watchlist",
            owner="default",
            profiles_dir=client.settings.profiles_dir,
            known_actions=client.rt.registry.names(),
        ).profile
        put_schedule(
            session,
            owner="default",
            profile=profile,
            spec=ScheduleSpec(cron="0 6 * * 1", timezone="Europe/Paris"),
            settings=client.settings,
            now=_now(),
        )

    [listed] = _json(flowbeat("schedules", "list", "--owner", "default", "--json"))["schedules"]
    assert (listed["pipeline"], listed["enabled"]) == ("watchlist", True)
    assert listed["next_fire_at"] is not None

    assert flowbeat("schedules", "pause", "watchlist").returncode == 0
    paused = _json(flowbeat("schedules", "show", "watchlist", "--json"))["schedule"]
    assert (paused["enabled"], paused["next_fire_at"]) == (False, None)
    assert "paused" in flowbeat("schedules", "list").stdout

    resumed = flowbeat("schedules", "resume", "watchlist")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    shown = _json(flowbeat("schedules", "show", "watchlist", "--json"))["schedule"]
    assert shown["enabled"] is True
    assert shown["next_fire_at"] is not None

    assert flowbeat("schedules", "delete", "watchlist").returncode == 0
    gone = flowbeat("schedules", "show", "watchlist")
    assert gone.returncode == 2
    assert "schedule_not_found" in gone.stdout


def test_schedule_commands_set_and_take_one_of_several_schedules_by_name_or_id(
    flowbeat: Cli,
) -> None:
    mine = ("--owner", f"ops-{uuid.uuid4().hex[:8]}")
    set_daily = ("schedules", "set", "watchlist", "--schedule", "daily")
    daily = _json(flowbeat(*set_daily, "--cron", "0 6 * * *", "--priority", "7", *mine, "--json"))
    monthly = _json(
        flowbeat(
            *("schedules", "set", "watchlist", "--add", "--name", "monthly"),
            *("--cron", "0 6 1 * *", "-p", 'papers=[{"pmid": "1"}]', *mine, "--json"),
        )
    )
    daily, monthly = daily["schedule"], monthly["schedule"]
    assert (daily["name"], daily["cron"], daily["priority"]) == ("daily", "0 6 * * *", 7)
    assert (monthly["name"], monthly["params"]) == ("monthly", {"papers": [{"pmid": "1"}]})
    changed = _json(flowbeat(*set_daily, "--priority", "3", *mine, "--json"))["schedule"]
    assert (changed["id"], changed["cron"], changed["priority"]) == (daily["id"], "0 6 * * *", 3)

    listed = _json(flowbeat("schedules", "list", "--pipeline", "watchlist", *mine, "--json"))
    assert [(s["id"], s["name"]) for s in listed["schedules"]] == [
        (daily["id"], "daily"),
        (monthly["id"], "monthly"),
    ]
    table = flowbeat("schedules", "list", *mine).stdout
    assert "daily" in table and "monthly" in table

    for refused in (
        flowbeat("schedules", "show", "watchlist", *mine),
        flowbeat("schedules", "set", "watchlist", "--every", "2d", *mine),
    ):
        assert refused.returncode == 2
        assert "schedule_ambiguous" in refused.stdout and daily["id"] in refused.stdout

    paused = flowbeat("schedules", "pause", "watchlist", "--schedule", "monthly", *mine)
    assert paused.returncode == 0 and "watchlist (monthly): paused" in paused.stdout
    shown = flowbeat("schedules", "show", "watchlist", "--schedule", monthly["id"], *mine, "--json")
    assert _json(shown)["schedule"]["enabled"] is False

    deleted = flowbeat("schedules", "delete", "watchlist", "--schedule", "daily", *mine)
    assert "watchlist (daily): schedule deleted" in deleted.stdout
    only = _json(flowbeat("schedules", "show", "watchlist", *mine, "--json"))["schedule"]
    assert only["id"] == monthly["id"]
    assert flowbeat("schedules", "delete", "watchlist", *mine).returncode == 0


def _now() -> Any:
    from service.platform.clock import utcnow

    return utcnow()


def test_pipelines_diff_shows_the_last_runs_new_items(
    flowbeat: Cli, shared_worker: Proc, client: Client
) -> None:
    def run(papers: list[dict[str, Any]]) -> str:
        done = flowbeat("run", "watchlist", "-p", f"papers={json.dumps(papers)}")
        assert done.returncode == 0, done.stdout + done.stderr
        [job_id] = re.findall(r"job (\S+) queued", done.stdout)
        return str(job_id)

    run([{"pmid": "1"}, {"pmid": "2"}])
    last = run([{"pmid": "2"}, {"pmid": "3"}, {"pmid": "4"}])

    diff = _json(flowbeat("pipelines", "diff", "watchlist", "--json"))

    assert diff["job_id"] == last
    assert diff["counts"] == {"new": 2, "removed": 1, "unchanged": 1}
    assert [item["pmid"] for item in diff["items"]] == ["3", "4"]
    removed = _json(flowbeat("pipelines", "diff", "watchlist", "--kind", "removed", "--json"))
    assert removed["items"] == [{"pmid": "1"}]
    assert "2 new, 1 removed" in flowbeat("pipelines", "diff", "watchlist").stdout
    never = flowbeat("pipelines", "diff", "slow")
    assert never.returncode == 2
    assert "no_result_items" in never.stdout


REVOKE_MARGIN_S = 1.0
"""The revocation is committed when ``keys revoke`` returns, and the API trusted the key for at
most the cache lifetime before that: on top of it, one poll interval of ``wait_for`` (0.1 s)
and one request to a local API, with room for a loaded machine."""


def test_a_revoked_key_is_refused_within_the_key_cache_lifetime(
    flowbeat: Cli, cluster: Cluster, client: Client
) -> None:
    cache_s = 3.0
    base = cluster.api(auth_cache_s=str(cache_s))
    with unit_of_work(client.rt.sessions) as session:
        key, row = create_api_key(session, owner="ops-revoke", scopes=["read"])
        prefix = row.prefix
    headers = {"Authorization": f"Bearer {key}"}
    assert httpx.get(f"{base}/v1/jobs", headers=headers).status_code == 200
    listed = _json(flowbeat("keys", "list", "--owner", "ops-revoke", "--json"))["keys"]
    assert [(k["prefix"], k["scopes"], k["revoked_at"]) for k in listed] == [
        (prefix, ["read"], None)
    ]

    done = flowbeat("keys", "revoke", prefix)

    assert done.returncode == 0, done.stdout + done.stderr
    wait_for(
        lambda: httpx.get(f"{base}/v1/jobs", headers=headers).status_code == 401,
        cache_s + REVOKE_MARGIN_S,
        "the revoked key to be refused",
    )
    assert _json(flowbeat("keys", "list", "--owner", "ops-revoke", "--json"))["keys"] == []
    again = flowbeat("keys", "revoke", prefix)
    assert again.returncode == 2
    assert "key_not_found" in again.stdout
