"""Every table the command prints fits an 80-column terminal: text folds onto more lines, and
ids, names and times stay whole on one line, so they can be copied."""

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import delete

from service.catalogue.saving import save_pipeline
from service.engine.runtime import Runtime
from service.platform.auth import create_api_key
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from service.platform.models import ApiKeyRow, PipelineRow, ScheduleRow
from service.platform.settings import get_settings
from tests.conftest import Stack

pytestmark = pytest.mark.e2e  # runs the flowbeat CLI as a process

ROOT = Path(__file__).resolve().parents[3]
WIDTH = 80

Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def flowbeat(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Cli:
    env = {**os.environ, **stack.env, "PYTHONPATH": str(ROOT), "COLUMNS": str(WIDTH)}
    env["FLOWBEAT_DATA_DIR"] = str(tmp_path_factory.mktemp("cli-data"))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "service.cli", *args]
        return subprocess.run(
            argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
        )

    return run


class Wide:
    """One owner's pipeline, schedule and key, each with long text around its ids."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:8]
        self.owner = f"team-literature-reviews-{tag}@example.org"
        self.pipeline = f"crispr-weekly-{tag}"
        self.tags = ["literature", "crispr", "weekly-digest", "shared-with-students"]
        self.key_prefix = ""


@pytest.fixture(scope="module")
def wide(runtime: Runtime) -> Iterator[Wide]:
    data = Wide()
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
    with unit_of_work(runtime.sessions) as session:
        session.execute(delete(ScheduleRow).where(ScheduleRow.owner == data.owner))
        session.execute(delete(PipelineRow).where(PipelineRow.owner == data.owner))
        session.execute(delete(ApiKeyRow).where(ApiKeyRow.owner == data.owner))


def _fits(done: subprocess.CompletedProcess[str], *whole: str, columns: str = "") -> None:
    """No line is wider than the terminal, nothing is cut short (rich's ellipsis), no column
    is dropped, and each of ``whole`` is on one line."""
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= WIDTH, done.stdout
    assert "\u2026" not in done.stdout, done.stdout
    for column in columns.split():
        assert column in done.stdout, (column, done.stdout)
    for text in whole:
        assert any(text in line for line in lines), (text, done.stdout)


def test_pipelines_list_fits_80_columns(flowbeat: Cli, wide: Wide) -> None:
    listed = flowbeat("pipelines", "list", "--owner", wide.owner)
    _fits(listed, wide.pipeline, columns="name owner version tags runs read-only")


def test_schedules_list_and_show_fit_80_columns(flowbeat: Cli, wide: Wide) -> None:
    columns = "pipeline owner when state next fire (UTC) last runs"
    listed = flowbeat("schedules", "list", "--owner", wide.owner)
    shown = flowbeat("schedules", "show", wide.pipeline, "--owner", wide.owner)
    _fits(listed, wide.pipeline, "weekdays", columns=columns)
    _fits(shown, wide.pipeline, "weekdays", columns=columns)


def test_keys_list_fits_80_columns(flowbeat: Cli, wide: Wide) -> None:
    listed = flowbeat("keys", "list", "--owner", wide.owner)
    _fits(listed, wide.key_prefix, columns="prefix owner scopes created (UTC) revoked")


def test_jobs_list_fits_80_columns(flowbeat: Cli) -> None:
    queued = flowbeat("run", "dag", "--no-wait")
    assert queued.returncode == 0, queued.stdout + queued.stderr
    job_id = queued.stdout.split("job ", 1)[1].split()[0]
    listed = flowbeat("jobs", "list", "--limit", "5")
    _fits(listed, job_id, columns="id pipeline status trigger created (UTC)")
    flowbeat("jobs", "cancel", job_id)
