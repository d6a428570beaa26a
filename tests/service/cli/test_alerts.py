"""``flowbeat alerts``, run as a user runs it: a rule set, listed in full when piped, shown as
JSON, refused with its code when it cannot work, and deleted; its deliveries listed."""

import json
import subprocess
import uuid

from tests.conftest import Stack
from tests.support.cli import run_cli

SECRET_NAME = "CLI_ALERT_KEY"


def _run(stack: Stack, owner: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **stack.env,
        "COLUMNS": "80",
        "FLOWBEAT_CLI_OWNER": owner,
        f"FLOWBEAT_SECRET_{SECRET_NAME}": "cli-secret",
    }
    return run_cli(["alerts", *args], env)


def test_a_rule_is_set_listed_shown_as_json_and_deleted(stack: Stack) -> None:
    owner = f"cli-{uuid.uuid4().hex[:6]}"
    url = "https://hooks.example.com/services/T000/B000/a-long-path-that-must-not-be-cut"
    rule = ["--kind", "step_retried", "--threshold", "3", "--url", url, "--secret", SECRET_NAME]

    saved = _run(stack, owner, "set", "retries", *rule, "--format", "slack")
    listed = _run(stack, owner, "list")
    as_json = _run(stack, owner, "list", "--json")
    deliveries = _run(stack, owner, "deliveries", "retries", "--json")
    deleted = _run(stack, owner, "delete", "retries")
    gone = _run(stack, owner, "deliveries", "retries")

    assert saved.returncode == 0, saved.stdout + saved.stderr
    assert "retries" in listed.stdout and "step_retried > 3" in listed.stdout
    assert f"\t{url}\t" in listed.stdout
    [alert] = json.loads(as_json.stdout)["alerts"]
    assert (alert["name"], alert["format"], alert["url"]) == ("retries", "slack", url)
    assert json.loads(deliveries.stdout) == {"deliveries": []}
    assert deleted.returncode == 0
    assert gone.returncode == 2 and "alert_not_found" in gone.stdout


def test_a_rule_that_cannot_work_is_refused_with_its_code(stack: Stack) -> None:
    owner = f"cli-{uuid.uuid4().hex[:6]}"

    refused = _run(stack, owner, "set", "x", "--kind", "queue_age", "--url", "https://a.example")
    listed = _run(stack, owner, "list", "--json")

    assert refused.returncode == 2
    assert "alert_rule_invalid" in refused.stdout and "threshold" in refused.stdout
    assert json.loads(listed.stdout) == {"alerts": []}
