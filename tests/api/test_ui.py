"""The dashboard: a key pasted once, kept in a cookie no script or other site can use, pages
that show what the API shows, and buttons that need the page's CSRF token and the key's scope."""

import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from service.runtime import Runtime
from service.settings import Settings
from tests.api.conftest import KeyFactory, _client


@pytest.fixture
def ui(settings: Settings, runtime: Runtime) -> Iterator[TestClient]:
    with _client(settings, runtime) as client:
        client.follow_redirects = False
        yield client


def _login(ui: TestClient, key: str) -> None:
    answer = ui.post("/ui/login", data={"key": key, "next": "/ui/jobs"})
    assert answer.status_code == 303, answer.text


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found, "no CSRF token on the page"
    return found.group(1)


def _submit(ui: TestClient, key: str) -> str:
    answer = ui.post(
        "/v1/jobs",
        json={"pipeline": "greet", "params": {"who": "ada"}},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert answer.status_code == 202, answer.text
    return str(answer.json()["job"]["id"])


def test_a_page_without_a_key_sends_the_person_to_log_in(ui: TestClient) -> None:
    answer = ui.get("/ui/jobs?status=failed")

    assert answer.status_code == 303
    assert answer.headers["location"] == "/ui/login?next=/ui/jobs%3Fstatus%3Dfailed"
    assert ui.get("/ui/login").status_code == 200


def test_a_wrong_key_is_refused_and_no_cookie_is_set(ui: TestClient) -> None:
    answer = ui.post("/ui/login", data={"key": "fb_not_a_key"})

    assert answer.status_code == 401
    assert "set-cookie" not in answer.headers


def test_the_key_is_kept_in_an_http_only_same_site_cookie(
    ui: TestClient, make_key: KeyFactory
) -> None:
    answer = ui.post("/ui/login", data={"key": make_key("read"), "next": "https://evil.test/"})

    cookie = answer.headers["set-cookie"].lower()
    assert answer.headers["location"] == "/ui/jobs"
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/ui" in cookie
    assert "secure" not in cookie


def test_over_https_the_cookie_is_secure(
    settings: Settings, runtime: Runtime, make_key: KeyFactory
) -> None:
    with _client(settings, runtime) as client:
        client.base_url = client.base_url.copy_with(scheme="https")
        answer = client.post("/ui/login", data={"key": make_key("read")}, follow_redirects=False)
    assert "secure" in answer.headers["set-cookie"].lower()


def test_pages_show_jobs_steps_pipelines_and_schedules(
    ui: TestClient, make_key: KeyFactory
) -> None:
    key = make_key("write")
    job_id = _submit(ui, key)
    _login(ui, key)

    listing = ui.get("/ui/jobs?status=queued")
    job = ui.get(f"/ui/jobs/{job_id}")
    panel = ui.get(f"/ui/jobs/{job_id}/panel")

    assert job_id in listing.text
    assert job.status_code == 200 and 'id="step-second"' in job.text and "queued" in job.text
    assert panel.status_code == 200 and "<html" not in panel.text
    assert "greet" in ui.get("/ui/pipelines").text
    pipeline = ui.get("/ui/pipelines/greet")
    assert (
        pipeline.status_code == 200 and "<svg" in pipeline.text and "name: greet" in pipeline.text
    )
    assert ui.get("/ui/schedules").status_code == 200


def test_a_button_without_the_page_token_changes_nothing(
    ui: TestClient, make_key: KeyFactory
) -> None:
    key = make_key("write")
    job_id = _submit(ui, key)
    _login(ui, key)
    token = _csrf(ui.get(f"/ui/jobs/{job_id}").text)

    forged = ui.post(f"/ui/jobs/{job_id}/cancel", data={"csrf": "0" * 64})
    cross_site = ui.post(
        f"/ui/jobs/{job_id}/cancel", data={"csrf": token}, headers={"Origin": "https://evil.test"}
    )
    still = ui.get(f"/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {key}"})

    assert forged.status_code == 403 and "csrf_invalid" in forged.text
    assert cross_site.status_code == 403 and "csrf_invalid" in cross_site.text
    assert still.json()["job"]["status"] == "queued"


def test_cancel_with_the_token_cancels_and_returns_to_the_job(
    ui: TestClient, make_key: KeyFactory
) -> None:
    key = make_key("write")
    job_id = _submit(ui, key)
    _login(ui, key)
    token = _csrf(ui.get(f"/ui/jobs/{job_id}").text)

    answer = ui.post(f"/ui/jobs/{job_id}/cancel", data={"csrf": token})

    assert answer.status_code == 303 and answer.headers["location"] == f"/ui/jobs/{job_id}"
    assert "cancelled" in ui.get(f"/ui/jobs/{job_id}").text


def test_a_read_key_sees_the_job_but_its_buttons_are_forbidden(
    ui: TestClient, make_key: KeyFactory
) -> None:
    owner = "ui-reader"
    job_id = _submit(ui, make_key("write", owner=owner))
    _login(ui, make_key("read", owner=owner))
    page = ui.get(f"/ui/jobs/{job_id}")

    answer = ui.post(f"/ui/jobs/{job_id}/cancel", data={"csrf": _csrf(page.text)})

    assert page.status_code == 200
    assert answer.status_code == 403 and "forbidden" in answer.text


def test_logging_out_forgets_the_key(ui: TestClient, make_key: KeyFactory) -> None:
    _login(ui, make_key("read"))
    token = _csrf(ui.get("/ui/jobs").text)

    answer = ui.post("/ui/logout", data={"csrf": token})

    assert answer.status_code == 303
    assert ui.get("/ui/jobs").status_code == 303


def test_the_dashboard_is_not_part_of_the_api_document(ui: TestClient) -> None:
    paths = ui.get("/openapi.json").json()["paths"]
    assert not [path for path in paths if path.startswith("/ui")]
