"""Every listing the command prints, read by a program or by a person.

Through a pipe (no terminal, no ``COLUMNS``) a listing is one row a line, tab-separated under
a header, every value whole, so ``grep`` and ``awk`` find an id, a name, a status and a time as
they are. At an 80-column terminal a listing is a table that fits: text folds onto more lines,
ids, names and statuses stay whole on one line, nothing is cut short."""

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import delete, update

from service.catalogue.saving import save_pipeline
from service.engine.runtime import Runtime
from service.engine.submission import JobRequest, submit_job
from service.platform.audit import Actor, record, saved_event
from service.platform.auth import create_api_key
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from service.platform.models import ApiKeyRow, JobRow, PipelineRow, ScheduleRow
from service.platform.settings import get_settings
from tests.conftest import Stack
from tests.support.cli import run_cli
from tests.support.terminal import at_terminal

ROOT = Path(__file__).resolve().parents[3]
WIDTH = 80

Piped = Callable[..., subprocess.CompletedProcess[str]]
Terminal = Callable[..., str]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("cli-data"))


@pytest.fixture(scope="module")
def env(stack: Stack, data_dir: str) -> dict[str, str]:
    env = {**os.environ, **stack.env, "PYTHONPATH": str(ROOT)}
    env.pop("COLUMNS", None)
    env["FLOWBEAT_DATA_DIR"] = data_dir
    return env


@pytest.fixture(scope="module")
def piped(stack: Stack, data_dir: str) -> Piped:
    env = {**stack.env, "COLUMNS": None, "FLOWBEAT_DATA_DIR": data_dir}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(args, env)

    return run


@pytest.fixture(scope="module")
def terminal(env: dict[str, str]) -> Terminal:
    def run(*args: str) -> str:
        argv = [sys.executable, "-m", "service.cli", *args]
        code, printed = at_terminal(argv, env, columns=WIDTH, cwd=str(ROOT), timeout_s=120)
        assert code == 0, printed
        return printed

    return run


class Wide:
    """One owner's pipeline, job, schedule, key and audit event, each with long names."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:8]
        self.owner = f"team-literature-reviews-{tag}@example.org"
        self.pipeline = f"papers-digest-{tag}"
        self.tags = ["literature", "crispr", "weekly-digest", "shared-with-students"]
        self.key_prefix = ""
        self.job_id = ""


def _save(runtime: Runtime, data: Wide) -> None:
    body = "\n".join(
        [
            f"name: {data.pipeline}",
            "description: the same literature search every week, saved to be run again",
            f"tags: [{', '.join(data.tags)}]",
            "steps:",
            "  - {id: s1, action: noop}",
        ]
    )
    with unit_of_work(runtime.sessions) as session:
        save_pipeline(
            session,
            owner=data.owner,
            name=None,
            body=body,
            settings=get_settings(),
            known_actions=runtime.registry.names(),
        )
        actor = Actor.of_cli("pipelines save", data.owner)
        record(session, actor, "pipeline.save", *saved_event(data.pipeline, data.owner, 1))
        job, _ = submit_job(
            session,
            JobRequest(pipeline=data.pipeline, params={}),
            owner=data.owner,
            profiles_dir=None,
            known_actions=runtime.registry.names(),
        )
        session.execute(
            update(JobRow)
            .where(JobRow.id == job.id)
            .values(status="succeeded", started_at=utcnow(), finished_at=utcnow())
        )
        data.job_id = str(job.id)


@pytest.fixture(scope="module")
def wide(runtime: Runtime) -> Iterator[Wide]:
    data = Wide()
    _save(runtime, data)
    with unit_of_work(runtime.sessions) as session:
        session.add(
            ScheduleRow(
                owner=data.owner,
                pipeline=data.pipeline,
                name="weekdays",
                cron="*/15 9-17 * * mon-fri",
                every_s=None,
                timezone="America/Argentina/Buenos_Aires",
                params={"query": "CRISPR base editing off-target effects"},
                enabled=False,
                overlap="skip",
                catchup="latest",
                catchup_window_s=3600,
                jitter_s=0,
                diff_mode=False,
                last_fire_at=utcnow(),
            )
        )
        _, key = create_api_key(session, owner=data.owner, scopes=["read", "write", "admin"])
        data.key_prefix = key.prefix
    yield data
    _forget(runtime, data)


@pytest.fixture
def unshared(runtime: Runtime) -> Iterator[Wide]:
    """A pipeline and job of one test's own, for a test that runs the job again: a listing of
    ``wide`` counts its pipeline's runs, whichever test of the module ran first."""
    data = Wide()
    _save(runtime, data)
    yield data
    _forget(runtime, data)


def _forget(runtime: Runtime, data: Wide) -> None:
    with unit_of_work(runtime.sessions) as session:
        session.execute(delete(ScheduleRow).where(ScheduleRow.owner == data.owner))
        session.execute(delete(JobRow).where(JobRow.owner == data.owner))
        session.execute(delete(PipelineRow).where(PipelineRow.owner == data.owner))
        session.execute(delete(ApiKeyRow).where(ApiKeyRow.owner == data.owner))


def _rows(done: subprocess.CompletedProcess[str], header: str) -> list[list[str]]:
    """The listing's rows under its header, each split at its tabs."""
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == header, done.stdout
    width = header.count("\t") + 1
    rows = [line.split("\t") for line in lines[1:]]
    assert all(len(row) == width for row in rows), done.stdout
    return rows


def test_jobs_list_through_a_pipe_prints_whole_ids_names_statuses_and_times(
    piped: Piped, wide: Wide
) -> None:
    rows = _rows(
        piped("jobs", "list", "--pipeline", wide.pipeline),
        "id\tpipeline\tstatus\ttrigger\tlabels\tcreated (UTC)",
    )

    [(job_id, pipeline, status, trigger, labels, created)] = rows
    assert (job_id, pipeline, status, trigger) == (wide.job_id, wide.pipeline, "succeeded", "api")
    assert labels == ""
    assert created.startswith(str(utcnow().year)) and len(created) == len("2026-11-29 09:00")


def test_pipelines_list_through_a_pipe_prints_whole_names_owners_and_tags(
    piped: Piped, wide: Wide
) -> None:
    rows = _rows(
        piped("pipelines", "list", "--owner", wide.owner),
        "name\towner\tversion\ttags\truns\tread-only",
    )

    assert [wide.pipeline, wide.owner, "1", ", ".join(wide.tags), "1", ""] in rows


def test_schedules_list_and_show_through_a_pipe_print_whole_values(
    piped: Piped, wide: Wide
) -> None:
    header = "pipeline\towner\twhen\tstate\tnext fire (UTC)\tlast\truns"
    listed = _rows(piped("schedules", "list", "--owner", wide.owner), header)
    shown = piped("schedules", "show", wide.pipeline, "--owner", wide.owner)

    [row] = listed
    assert row[:4] == [
        wide.pipeline,
        wide.owner,
        "weekdays: */15 9-17 * * mon-fri America/Argentina/Buenos_Aires",
        "paused",
    ]
    assert shown.stdout.splitlines()[:2] == [header, "\t".join(row)]


def test_keys_list_through_a_pipe_prints_whole_prefixes_and_owners(
    piped: Piped, wide: Wide
) -> None:
    rows = _rows(
        piped("keys", "list", "--owner", wide.owner),
        "prefix\towner\tscopes\tcreated (UTC)\trevoked",
    )

    [row] = rows
    assert row[:3] == [wide.key_prefix, wide.owner, "admin,read,write"]


def test_queues_through_a_pipe_prints_a_row_per_queue(piped: Piped) -> None:
    rows = _rows(piped("queues"), "queue\tdepth\tby priority\toldest\tworkers")

    assert "default" in [row[0] for row in rows]


def test_audit_through_a_pipe_prints_whole_actors_and_targets(piped: Piped, wide: Wide) -> None:
    rows = _rows(
        piped("audit", "--target", f"pipeline:{wide.pipeline}"),
        "time (UTC)\tvia\tactor\taction\ttarget",
    )

    [row] = rows
    assert row[1:] == [
        "cli",
        f"{row[2].split(' as ')[0]} as {wide.owner}",
        "pipeline.save",
        f"pipeline:{wide.pipeline}",
    ]


def test_actions_through_a_pipe_prints_each_action_and_its_inputs(piped: Piped) -> None:
    listed = _rows(piped("actions"), "action\tsource\tcache\tretry\tsummary")
    shown = piped("actions", "pubmed.search")

    kinds = {row[0]: row[1:4] for row in listed}
    assert kinds["drill.count"] == ["module", "yes", "yes"]
    assert kinds["wait"] == ["engine", "no", "no"]
    assert "pubmed.search: builtin (service.actions.pubmed)" in shown.stdout.splitlines()
    assert "term\tstring\tyes\t" in shown.stdout.splitlines()


def test_commands_that_show_a_job_or_a_pipeline_answer_json(piped: Piped, unshared: Wide) -> None:
    shown = piped("pipelines", "show", unshared.pipeline, "--owner", unshared.owner, "--json")
    rerun = piped("jobs", "rerun", unshared.job_id, "--json")
    new_id = json.loads(rerun.stdout)["job"]["id"]
    cancelled = piped("jobs", "cancel", new_id, "--json")

    pipeline = json.loads(shown.stdout)["pipeline"]
    assert (pipeline["name"], pipeline["owner"], pipeline["version"]) == (
        unshared.pipeline,
        unshared.owner,
        1,
    )
    assert pipeline["profile"]["steps"][0]["action"] == "noop"
    assert json.loads(rerun.stdout)["job"]["pipeline"] == unshared.pipeline
    job = json.loads(cancelled.stdout)["job"]
    assert (job["id"], job["status"]) == (new_id, "cancelled")


def test_an_unknown_action_is_refused_with_the_closest_names(
    piped: Piped, wide: Wide, tmp_path: Path
) -> None:
    profile = tmp_path / "typo.yaml"
    profile.write_text("name: typo\nsteps:\n  - {id: find, action: pubmed.serach}\n")

    saved = piped("pipelines", "save", str(profile), "--owner", wide.owner)
    asked = piped("actions", "pubmed.serach")

    closest = "did you mean 'pubmed.search', 'pubmed.summary'?"
    assert saved.returncode == 2 and "unknown action 'pubmed.serach'" in saved.stdout
    assert closest in saved.stdout
    assert asked.returncode == 2 and asked.stdout.startswith("unknown_action: ")
    assert closest in asked.stdout


def _fits(printed: str, *whole: str, columns: str = "") -> None:
    """No line is wider than the terminal, nothing is cut short (rich's ellipsis), no column
    is dropped, and each of ``whole`` is on one line."""
    lines = printed.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= WIDTH, printed
    assert "\u2026" not in printed, printed
    for column in columns.split():
        assert column in printed, (column, printed)
    for text in whole:
        assert any(text in line for line in lines), (text, printed)


@pytest.mark.e2e  # runs the command at a terminal (a pty) as a process
def test_jobs_list_at_an_80_column_terminal_prints_records_with_every_value_whole(
    terminal: Terminal, wide: Wide
) -> None:
    printed = terminal("jobs", "list", "--pipeline", wide.pipeline)

    _fits(printed, wide.job_id, wide.pipeline, "succeeded", columns="id pipeline status trigger")


@pytest.mark.e2e  # runs the command at a terminal (a pty) as a process
def test_pipelines_list_at_an_80_column_terminal_keeps_the_name_whole(
    terminal: Terminal, wide: Wide
) -> None:
    printed = terminal("pipelines", "list", "--owner", wide.owner)

    _fits(printed, wide.pipeline, columns="name owner version tags runs read-only")


@pytest.mark.e2e  # runs the command at a terminal (a pty) as a process
def test_schedules_list_and_show_fit_an_80_column_terminal(terminal: Terminal, wide: Wide) -> None:
    columns = "pipeline owner when state next fire (UTC) last runs"
    listed = terminal("schedules", "list", "--owner", wide.owner)
    shown = terminal("schedules", "show", wide.pipeline, "--owner", wide.owner)

    _fits(listed, wide.pipeline, "paused", columns=columns)
    _fits(shown, wide.pipeline, "paused", columns=columns)


@pytest.mark.e2e  # runs the command at a terminal (a pty) as a process
def test_keys_list_fits_an_80_column_terminal(terminal: Terminal, wide: Wide) -> None:
    printed = terminal("keys", "list", "--owner", wide.owner)

    _fits(printed, wide.key_prefix, columns="prefix owner scopes created (UTC) revoked")


@pytest.mark.e2e  # runs the command at a terminal (a pty) as a process
def test_audit_and_actions_fit_an_80_column_terminal(terminal: Terminal, wide: Wide) -> None:
    audit = terminal("audit", "--target", f"pipeline:{wide.pipeline}")
    actions = terminal("actions")

    _fits(audit, "pipeline.save", columns="via actor action target")
    _fits(actions, "europepmc.search", "pipeline.run", columns="action source cache retry")
