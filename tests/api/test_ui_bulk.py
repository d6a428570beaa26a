"""The dashboard's label filter and its bulk actions: the list finds jobs by label and error
code, and a bulk cancel shows the count first, then acts once however often it is clicked."""

import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from service.engine.runtime import Runtime
from service.platform.settings import Settings
from tests.api.conftest import KeyFactory
from tests.api.test_ui import _csrf, _login
from tests.support.apps import api_client


@pytest.fixture
def ui(settings: Settings, runtime: Runtime) -> Iterator[TestClient]:
    with api_client(settings, runtime) as client:
        client.follow_redirects = False
        yield client


def _submit(ui: TestClient, key: str, **labels: str) -> str:
    body = {"pipeline": "greet", "params": {"who": "ada"}, "labels": labels}
    answer = ui.post("/v1/jobs", json=body, headers={"Authorization": f"Bearer {key}"})
    assert answer.status_code == 202, answer.text
    return str(answer.json()["job"]["id"])


def test_the_list_filters_by_label_and_offers_to_act_on_every_match(
    ui: TestClient, make_key: KeyFactory
) -> None:
    key = make_key("write")
    acme = _submit(ui, key, tenant="acme", study="17")
    other = _submit(ui, key, tenant="globex")
    _login(ui, key)

    page = ui.get("/ui/jobs", params={"labels": "tenant:acme study:17"}).text

    assert acme[:8] in page and other[:8] not in page
    assert "tenant=acme" in page
    assert 'href="/ui/jobs?labels=study%3A17">study=17</a>' in ui.get(f"/ui/jobs/{acme}").text
    assert "/ui/bulk?action=cancel&" in page


def test_a_bulk_cancel_asks_with_the_count_then_cancels_once_however_often_confirmed(
    ui: TestClient, make_key: KeyFactory
) -> None:
    key = make_key("write")
    doomed = [_submit(ui, key, tenant="acme") for _ in range(3)]
    kept = _submit(ui, key, tenant="globex")
    _login(ui, key)

    ask = ui.get("/ui/bulk", params={"action": "cancel", "labels": "tenant:acme"}).text
    form = dict(re.findall(r'name="(\w+)" value="([^"]*)"', ask))
    first = ui.post("/ui/bulk", data={**form, "csrf": _csrf(ask)})
    again = ui.post("/ui/bulk", data={**form, "csrf": _csrf(ask)})

    assert "Cancel <strong>3</strong> jobs?" in ask
    assert first.status_code == 200, first.text
    assert "cancel: <strong>3</strong> jobs" in first.text
    assert "cancel: <strong>3</strong> jobs" in again.text
    for job_id in doomed:
        assert 'class="status cancelled"' in ui.get(f"/ui/jobs/{job_id}").text
    assert 'class="status cancelled"' not in ui.get(f"/ui/jobs/{kept}").text


def test_a_bulk_action_without_the_page_token_changes_nothing(
    ui: TestClient, make_key: KeyFactory
) -> None:
    key = make_key("write")
    job_id = _submit(ui, key, tenant="acme")
    _login(ui, key)
    form = {"action": "cancel", "bulk_id": "6f1c0b8e-0000-4000-8000-000000000000"}

    answer = ui.post("/ui/bulk", data={**form, "labels": "tenant:acme", "csrf": "forged"})

    assert answer.status_code == 403, answer.text
    assert 'class="status cancelled"' not in ui.get(f"/ui/jobs/{job_id}").text
