"""The dashboard links a job and the child jobs its ``pipeline.run`` steps started, both ways."""

import uuid
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from service.engine.runtime import Runtime
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from service.platform.models import ChildCallRow, JobRow
from service.platform.settings import Settings
from tests.api.conftest import KeyFactory
from tests.support.apps import api_client


@pytest.fixture
def ui(settings: Settings, runtime: Runtime) -> Iterator[TestClient]:
    with api_client(settings, runtime) as client:
        client.follow_redirects = False
        yield client


def _submit(ui: TestClient, key: str) -> uuid.UUID:
    answer = ui.post(
        "/v1/jobs",
        json={"pipeline": "greet", "params": {"who": "ada"}},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert answer.status_code == 202, answer.text
    return uuid.UUID(answer.json()["job"]["id"])


def test_a_job_page_links_its_childs_and_the_child_its_callers(
    ui: TestClient, runtime: Runtime, make_key: KeyFactory
) -> None:
    key = make_key("write")
    parent, child = _submit(ui, key), _submit(ui, key)
    with unit_of_work(runtime.sessions) as session:
        session.add(
            ChildCallRow(
                job_id=parent,
                step_id="first",
                attempt=1,
                pipeline="greet",
                params={},
                wait=True,
                started=True,
                child_job_id=child,
                created_at=utcnow(),
            )
        )
        session.execute(update(JobRow).where(JobRow.id == child).values(trigger="parent"))
    assert ui.post("/ui/login", data={"key": key}).status_code == 303

    parent_page = ui.get(f"/ui/jobs/{parent}").text
    child_page = ui.get(f"/ui/jobs/{child}/panel").text

    assert f'child job <a href="/ui/jobs/{child}">' in parent_page
    assert f'started by step <a href="/ui/jobs/{parent}#step-first">first of' in child_page
    assert "started by" not in parent_page


@pytest.mark.parametrize(
    ("trigger", "says", "not_said"),
    [
        ("rerun", "rerun of", "started by the success of"),
        ("dependency", "started by the success of", "rerun of"),
    ],
)
def test_a_job_page_names_how_it_came_from_its_parent_job(
    ui: TestClient, runtime: Runtime, make_key: KeyFactory, trigger: str, says: str, not_said: str
) -> None:
    key = make_key("write")
    upstream, job = _submit(ui, key), _submit(ui, key)
    with unit_of_work(runtime.sessions) as session:
        session.execute(
            update(JobRow).where(JobRow.id == job).values(trigger=trigger, parent_job_id=upstream)
        )
    assert ui.post("/ui/login", data={"key": key}).status_code == 303

    page = ui.get(f"/ui/jobs/{job}/panel").text
    listed = ui.get(f"/ui/jobs?parent={upstream}").text

    assert f'{says} <a href="/ui/jobs/{upstream}">' in page
    assert not_said not in page
    assert f'<a href="/ui/jobs/{job}">' in listed
    assert f'<a href="/ui/jobs/{upstream}">' not in listed.split("<table")[1]
