"""The dashboard: a key pasted once, kept in a cookie no script or other site can use, pages
that show what the API shows, and buttons that need the page's CSRF token and the key's scope."""

import re
import uuid
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from service.engine.runner import run_step
from service.engine.runtime import Runtime
from service.engine.steps import StepKey
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from service.platform.errors import RetryLater
from service.platform.models import PipelineRow, PipelineVersionRow
from service.platform.settings import Settings
from service.triggers.backfills import top_up
from tests.api.conftest import KeyFactory
from tests.support.approvals import parked_job
from tests.support.apps import api_client


@pytest.fixture
def ui(settings: Settings, runtime: Runtime) -> Iterator[TestClient]:
    with api_client(settings, runtime) as client:
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


def test_a_login_posted_from_another_site_is_refused_and_no_cookie_is_set(
    ui: TestClient, make_key: KeyFactory
) -> None:
    key = make_key("read")

    forged = ui.post("/ui/login", data={"key": key}, headers={"Origin": "https://evil.test"})
    ours = ui.post("/ui/login", data={"key": key}, headers={"Origin": "http://testserver"})

    assert forged.status_code == 403 and "csrf_invalid" in forged.text
    assert "set-cookie" not in forged.headers
    assert ours.status_code == 303 and "set-cookie" in ours.headers


def test_a_wrong_key_is_refused_and_no_cookie_is_set(ui: TestClient) -> None:
    answer = ui.post("/ui/login", data={"key": "fb_not_a_key"})

    assert answer.status_code == 401
    assert "set-cookie" not in answer.headers


def test_the_key_is_kept_in_an_http_only_same_site_cookie(
    ui: TestClient, make_key: KeyFactory
) -> None:
    answer = ui.post("/ui/login", data={"key": make_key("read"), "next": "https://evil.test/"})

    cookie = answer.headers["set-cookie"].lower()
    assert answer.headers["location"] == "/ui/home"
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/ui" in cookie
    assert "secure" not in cookie


def test_over_https_the_cookie_is_secure(
    settings: Settings, runtime: Runtime, make_key: KeyFactory
) -> None:
    with api_client(settings, runtime) as client:
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


def test_a_pipelines_page_lists_each_of_its_schedules(ui: TestClient, make_key: KeyFactory) -> None:
    key = make_key("write")
    headers = {"Authorization": f"Bearer {key}"}
    ids = []
    for body in (
        {"name": "daily", "every": "1d", "priority": 8, "params": {"who": "ada"}},
        {"name": "monthly", "cron": "0 6 1 * *", "params": {"who": "bob"}},
    ):
        answer = ui.post("/v1/pipelines/greet/schedules", json=body, headers=headers)
        assert answer.status_code == 201, answer.text
        ids.append(answer.json()["schedule"]["id"])
    _login(ui, key)

    page = ui.get("/ui/pipelines/greet").text
    listing = ui.get("/ui/schedules").text

    for text in (page, listing):
        assert "daily" in text and "monthly" in text and "0 6 1 * *" in text
        assert all(schedule_id in text for schedule_id in ids)
    assert "<td>8</td>" in page


def test_a_pipelines_page_shows_each_backfills_progress(
    ui: TestClient, runtime: Runtime, make_key: KeyFactory
) -> None:
    key = make_key("write")
    headers = {"Authorization": f"Bearer {key}"}
    body = {"name": "weekly", "cron": "0 6 * * 1", "params": {"who": "ada"}}
    schedule = ui.post("/v1/pipelines/greet/schedules", json=body, headers=headers).json()
    url = f"/v1/pipelines/greet/schedules/{schedule['schedule']['id']}/backfill"
    span = {"from": "2025-01-01T00:00:00Z", "to": "2025-03-01T00:00:00Z", "max_active": 2}
    made = ui.post(url, json=span, headers=headers).json()["backfill"]
    with unit_of_work(runtime.sessions) as session:
        top_up(
            session,
            uuid.UUID(made["id"]),
            profiles_dir=runtime.settings.profiles_dir,
            known_actions=runtime.registry.names(),
            now=utcnow(),
        )
    _login(ui, key)

    page = ui.get("/ui/pipelines/greet").text
    ui.post(f"{url}/{made['id']}/cancel", headers=headers)

    assert made["id"] in page
    assert '<progress max="8" value="0">' in page
    assert "0/8 fires, 2 open of at most 2" in page
    assert "queued 2" in page


def test_a_saved_pipeline_shows_the_text_it_was_saved_from(
    ui: TestClient, runtime: Runtime, make_key: KeyFactory
) -> None:
    key = make_key("write")
    name = f"p-{uuid.uuid4().hex[:10]}"
    text = f"# weekly <search>, kept as written\nname: {name}\nsteps: [{{id: a, action: noop}}]\n"
    saved = ui.put(
        f"/v1/pipelines/{name}",
        content=text.encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/yaml"},
    )
    assert saved.status_code == 201, saved.text
    _login(ui, key)

    page = ui.get(f"/ui/pipelines/{name}")
    assert page.status_code == 200
    assert "# weekly &lt;search&gt;, kept as written" in page.text
    assert "steps: [{id: a, action: noop}]" in page.text

    # A version saved before the text was kept shows its profile, serialised.
    with unit_of_work(runtime.sessions) as session:
        session.execute(
            update(PipelineVersionRow)
            .where(PipelineVersionRow.pipeline_id == PipelineRow.id, PipelineRow.name == name)
            .values(source=None)
        )
    older = ui.get(f"/ui/pipelines/{name}")
    assert "kept as written" not in older.text and f"name: {name}" in older.text


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


def _approval(ui: TestClient, key: str, job_id: str) -> str:
    listed = ui.get(
        "/v1/approvals?status=pending,approved,rejected",
        headers={"Authorization": f"Bearer {key}"},
    ).json()["approvals"]
    return next(str(a["status"]) for a in listed if a["job_id"] == job_id)


@pytest.mark.parametrize(
    ("decision", "decided", "job_status"),
    [
        ("approve", "approved", "running"),
        ("reject", "rejected", "failed"),
    ],
)
def test_a_waiting_step_is_decided_through_its_button(
    ui: TestClient,
    make_key: KeyFactory,
    runtime: Runtime,
    decision: str,
    decided: str,
    job_status: str,
) -> None:
    key = make_key("read", "write")
    job_id = parked_job(ui, {"Authorization": f"Bearer {key}"}, runtime)
    _login(ui, key)
    page = ui.get(f"/ui/jobs/{job_id}").text
    action = f"/ui/jobs/{job_id}/steps/gate/{decision}"
    assert f'action="{action}"' in page

    answer = ui.post(action, data={"csrf": _csrf(page), "comment": "seen on the page"})

    assert answer.status_code == 303 and answer.headers["location"] == f"/ui/jobs/{job_id}"
    assert _approval(ui, key, job_id) == decided
    assert f'id="job-status">{job_status}<' in ui.get(f"/ui/jobs/{job_id}").text


def test_the_inbox_lists_waiting_gates_and_a_decision_there_returns_to_it(
    ui: TestClient, make_key: KeyFactory, runtime: Runtime
) -> None:
    key = make_key("read", "write")
    job_id = parked_job(ui, {"Authorization": f"Bearer {key}"}, runtime)
    _login(ui, key)
    inbox = ui.get("/ui/approvals").text
    assert f'data-job="{job_id}" data-step="gate" data-status="pending"' in inbox
    assert 'name="back" value="/ui/approvals"' in inbox

    answer = ui.post(
        f"/ui/jobs/{job_id}/steps/gate/approve",
        data={"csrf": _csrf(inbox), "comment": "from the inbox", "back": "/ui/approvals"},
    )

    assert answer.status_code == 303 and answer.headers["location"] == "/ui/approvals"
    assert _approval(ui, key, job_id) == "approved"
    assert f'data-job="{job_id}"' not in ui.get("/ui/approvals").text


def test_a_decision_never_sends_the_browser_off_the_dashboard(
    ui: TestClient, make_key: KeyFactory, runtime: Runtime
) -> None:
    key = make_key("read", "write")
    job_id = parked_job(ui, {"Authorization": f"Bearer {key}"}, runtime)
    _login(ui, key)
    page = ui.get(f"/ui/jobs/{job_id}").text

    answer = ui.post(
        f"/ui/jobs/{job_id}/steps/gate/reject",
        data={"csrf": _csrf(page), "back": "https://elsewhere.example/ui/"},
    )

    assert answer.status_code == 303 and answer.headers["location"] == "/ui/home"


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_a_decision_without_the_page_token_or_from_another_site_changes_nothing(
    ui: TestClient, make_key: KeyFactory, runtime: Runtime, decision: str
) -> None:
    key = make_key("read", "write")
    job_id = parked_job(ui, {"Authorization": f"Bearer {key}"}, runtime)
    _login(ui, key)
    token = _csrf(ui.get(f"/ui/jobs/{job_id}").text)
    action = f"/ui/jobs/{job_id}/steps/gate/{decision}"

    missing = ui.post(action, data={})
    forged = ui.post(action, data={"csrf": "0" * 64})
    cross_site = ui.post(action, data={"csrf": token}, headers={"Origin": "https://evil.test"})

    for answer in (missing, forged, cross_site):
        assert answer.status_code == 403 and "csrf_invalid" in answer.text
    assert _approval(ui, key, job_id) == "pending"
    assert 'id="job-status">awaiting_approval<' in ui.get(f"/ui/jobs/{job_id}").text


ROUNDS = 3
LOOPED = {
    "name": "looped",
    "loops": [
        {
            "steps": ["try"],
            "until": "${{ steps.try.output.approved }}",
            "max_rounds": ROUNDS,
            "on_exhausted": "continue",
        }
    ],
    "steps": [{"id": "try", "action": "noop", "with": {"approved": False}}],
}


def test_a_step_in_a_loop_shows_its_earlier_rounds(
    ui: TestClient, make_key: KeyFactory, runtime: Runtime
) -> None:
    key = make_key("read", "write")
    answer = ui.post(
        "/v1/jobs", json={"pipeline": LOOPED}, headers={"Authorization": f"Bearer {key}"}
    )
    job_id = answer.json()["job"]["id"]
    for _ in range(ROUNDS):
        run_step(runtime, StepKey(uuid.UUID(job_id), "try"), task_id=uuid.uuid4().hex)
    _login(ui, key)

    panel = ui.get(f"/ui/jobs/{job_id}/panel").text

    rounds = re.findall(r'data-round="(\d+)" data-status="(\w+)">(.*?)</li>', panel, re.DOTALL)
    assert [(number, status) for number, status, _ in rounds] == [
        ("1", "succeeded"),
        ("2", "succeeded"),
    ]
    assert all("→" in shown for _, _, shown in rounds), "a round without its start and end"
    assert f"round {ROUNDS}" in panel and 'id="job-status">succeeded<' in panel


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


def _chatty_job(ui: TestClient, runtime: Runtime, key: str, **with_: object) -> str:
    profile = {
        "name": "chatty-ui",
        "steps": [
            {
                "id": "talk",
                "action": "drill.chatter",
                "with": with_,
                "retry": {"attempts": 2, "backoff_s": 0, "jitter": 0},
            }
        ],
    }
    answer = ui.post(
        "/v1/jobs", json={"pipeline": profile}, headers={"Authorization": f"Bearer {key}"}
    )
    job_id: str = answer.json()["job"]["id"]
    for _ in range(1 + int(str(with_.get("fail_attempts", 0)))):
        try:
            run_step(runtime, StepKey(uuid.UUID(job_id), "talk"), task_id=uuid.uuid4().hex)
        except RetryLater:
            continue
    return job_id


def test_a_step_shows_the_tail_of_its_log_and_links_its_whole_log(
    ui: TestClient, make_key: KeyFactory, runtime: Runtime
) -> None:
    key = make_key("read", "write")
    job_id = _chatty_job(ui, runtime, key, lines=30)
    _login(ui, key)

    panel = ui.get(f"/ui/jobs/{job_id}/panel").text
    whole = ui.get(f"/ui/jobs/{job_id}/steps/talk/logs").text

    assert "log: 90 lines, the last 50" in panel
    shown = re.findall(r'<span class="line (\w+)" data-attempt="1">([^<]*)</span>', panel)
    assert len(shown) == 50
    assert shown[-1][1].endswith("#1 printed line 30")
    assert shown[-2][0] == "warning" and shown[-2][1].endswith("logger line 30")
    assert f'href="/ui/jobs/{job_id}/steps/talk/logs"' in panel
    assert len(re.findall(r'<span class="line', whole)) == 90


def test_a_failed_attempt_s_lines_show_escaped_and_one_attempt_on_request(
    ui: TestClient, make_key: KeyFactory, runtime: Runtime
) -> None:
    key = make_key("read", "write")
    job_id = _chatty_job(ui, runtime, key, fail_attempts=1, say="<script>alert(1)</script>")
    _login(ui, key)

    panel = ui.get(f"/ui/jobs/{job_id}/panel").text
    second = ui.get(f"/ui/jobs/{job_id}/steps/talk/logs?attempt=2").text

    assert "<script>alert(1)</script>" not in panel
    assert "#1 &lt;script&gt;alert(1)&lt;/script&gt;" in panel
    assert "#2 &lt;script&gt;alert(1)&lt;/script&gt;" in panel
    assert set(re.findall(r'data-attempt="(\d+)"', second)) == {"2"}


def test_another_owner_s_step_log_is_not_found(
    ui: TestClient, make_key: KeyFactory, runtime: Runtime
) -> None:
    job_id = _chatty_job(ui, runtime, make_key("read", "write"))
    _login(ui, make_key("read"))

    answer = ui.get(f"/ui/jobs/{job_id}/steps/talk/logs")

    assert answer.status_code == 404 and "job_not_found" in answer.text


def test_the_queues_page_shows_what_waits_in_each_queue_and_a_job_its_priority(
    ui: TestClient, make_key: KeyFactory
) -> None:
    key = make_key("write")
    queue = f"pool{uuid.uuid4().hex[:6]}"
    profile = {"name": "pooled", "queue": queue, "steps": [{"id": "only", "action": "noop"}]}
    answer = ui.post(
        "/v1/jobs",
        json={"pipeline": profile, "priority": 7},
        headers={"Authorization": f"Bearer {key}"},
    )
    job_id = answer.json()["job"]["id"]
    _login(ui, key)

    page = ui.get("/ui/queues")
    panel = ui.get(f"/ui/jobs/{job_id}/panel")

    assert page.status_code == 200
    row = page.text.split(f"<code>{queue}</code>", 1)[1].split("</tr>", 1)[0]
    assert "<td>1</td>" in row and "none" in row, "one message, no worker of its pool"
    assert "priority 7" in panel.text


def test_the_actions_page_lists_each_action_with_its_inputs(
    ui: TestClient, make_key: KeyFactory
) -> None:
    _login(ui, make_key("read"))

    page = ui.get("/ui/actions")

    assert page.status_code == 200
    assert 'id="pubmed.search"' in page.text and 'id="drill.count"' in page.text
    assert "<code>term</code></td><td>string</td><td>yes</td>" in page.text
    assert 'href="/ui/actions"' in page.text
