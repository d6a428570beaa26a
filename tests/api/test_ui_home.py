"""The dashboard's home: the overview's figures, each a link to the jobs it counts, and a chart
whose bars open the jobs of their minute."""

import re
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from service.engine.runtime import Runtime
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from service.platform.models import JobRow
from service.platform.settings import Settings
from tests.api.conftest import KeyFactory
from tests.api.test_overview import raise_alerts, settle, submit
from tests.support.apps import api_client


@pytest.fixture
def ui(settings: Settings, runtime: Runtime) -> Iterator[TestClient]:
    with api_client(settings, runtime) as client:
        client.follow_redirects = False
        yield client


@pytest.fixture
def key(make_key: KeyFactory) -> str:
    return make_key("read", "write")


def _login(ui: TestClient, key: str) -> None:
    assert ui.post("/ui/login", data={"key": key}).headers["location"] == "/ui/home"


def _figure(page: str, name: str) -> tuple[int, str]:
    found = re.search(rf'id="fig-{name}" data-count="(\d+)" href="([^"]+)"', page)
    assert found, f"no figure {name} on the page"
    return int(found.group(1)), found.group(2).replace("&amp;", "&")


def _query(link: str) -> dict[str, str]:
    return {k: v for k, [v] in parse_qs(urlsplit(link).query).items()}


def test_each_figure_links_to_the_jobs_it_counts(
    ui: TestClient, key: str, runtime: Runtime
) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    failed, _ = submit(ui, headers), submit(ui, headers)
    settle(runtime, failed, "failed", took_s=1)
    _login(ui, key)

    page = ui.get("/ui/home")

    assert page.status_code == 200, page.text
    overview = ui.get("/v1/overview", headers=headers).json()
    started, to_started = _figure(page.text, "started")
    count, to_failed = _figure(page.text, "failed")
    queued, to_queued = _figure(page.text, "queued")
    assert (started, count, queued) == (2, 1, 1)
    assert overview["totals"]["failed"] == count and overview["open"]["queued"] == queued
    window = _query(to_started)
    since, until = (datetime.fromisoformat(window[edge]) for edge in ("since", "until"))
    assert since <= utcnow() < until == since + timedelta(hours=1)
    assert _query(to_failed) == {"status": "failed", **window}
    assert _query(to_queued) == {"status": "queued"}
    assert 'href="/ui/jobs?status=failed&amp;pipeline=greet&amp;since=' in page.text


def test_a_followed_figure_lists_only_the_jobs_of_its_window(
    ui: TestClient, key: str, runtime: Runtime
) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    earlier, now = submit(ui, headers), submit(ui, headers)
    for job_id in (earlier, now):
        settle(runtime, job_id, "failed", took_s=1)
    with unit_of_work(runtime.sessions) as session:
        session.execute(
            update(JobRow)
            .where(JobRow.id == earlier)
            .values(created_at=JobRow.created_at - timedelta(hours=2))
        )
    _login(ui, key)
    _, to_failed = _figure(ui.get("/ui/home").text, "failed")

    listed = ui.get(to_failed).text

    assert f"/ui/jobs/{now}" in listed and f"/ui/jobs/{earlier}" not in listed
    assert 'id="window"' in listed
    assert f"/ui/jobs/{earlier}" in ui.get("/ui/jobs?status=failed").text
    assert ui.get("/ui/jobs?since=yesterday").status_code == 400


def test_a_bar_opens_the_jobs_of_its_minute(ui: TestClient, key: str, runtime: Runtime) -> None:
    job_id = submit(ui, {"Authorization": f"Bearer {key}"})
    settle(runtime, job_id, "failed", took_s=1)
    _login(ui, key)

    panel = ui.get("/ui/home/panel").text

    (link,) = re.findall(r'<a href="([^"]+)" data-kind="failed" data-count="1">', panel)
    query = _query(link.replace("&amp;", "&"))
    since, until = (datetime.fromisoformat(query[edge]) for edge in ("since", "until"))
    assert query["status"] == "failed"
    assert until - since == timedelta(minutes=1) and since.second == 0
    assert "<h1>" not in panel


def test_the_day_is_one_click_away(ui: TestClient, key: str) -> None:
    _login(ui, key)

    page = ui.get("/ui/home?window=day").text

    assert 'data-window="day"' in page
    assert "per 15 min" in page


def test_the_dashboard_opens_on_its_home(ui: TestClient) -> None:
    assert ui.get("/ui").headers["location"] == "/ui/home"
    assert ui.get("/ui/home").headers["location"] == "/ui/login?next=/ui/home"


def test_a_key_sees_only_its_own_jobs_counted(
    ui: TestClient, key: str, make_key: KeyFactory
) -> None:
    submit(ui, {"Authorization": f"Bearer {key}"})
    _login(ui, make_key("read", owner=f"other-{uuid.uuid4().hex[:6]}"))

    started, _ = _figure(ui.get("/ui/home").text, "started")

    assert started == 0


def test_the_last_alerts_open_the_job_they_are_about(
    ui: TestClient, make_key: KeyFactory, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = f"o-{uuid.uuid4().hex[:8]}"
    key = make_key("read", "write", owner=owner)
    headers = {"Authorization": f"Bearer {key}"}
    job_id = raise_alerts(ui, runtime, headers, owner, 1, monkeypatch)
    _login(ui, key)

    page = ui.get("/ui/home").text

    assert f'<a href="/ui/jobs/{job_id}">failure 0</a>' in page
