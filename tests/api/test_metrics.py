"""``/metrics`` speaks Prometheus, needs a key, and counts what PostgreSQL and the broker hold."""

import re

from fastapi.testclient import TestClient

from tests.api.conftest import KeyFactory


def _value(text: str, series: str) -> float:
    match = re.search(rf"^{re.escape(series)} (\S+)$", text, flags=re.M)
    assert match, f"{series} missing from:\n{text}"
    return float(match.group(1))


def test_metrics_need_a_key(client: TestClient) -> None:
    response = client.get("/metrics")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"


def test_metrics_count_jobs_steps_and_queued_messages(
    client: TestClient, make_key: KeyFactory
) -> None:
    reader = {"Authorization": f"Bearer {make_key('read')}"}
    writer = {"Authorization": f"Bearer {make_key('write')}"}
    before = client.get("/metrics", headers=reader)
    assert before.status_code == 200
    assert before.headers["content-type"].startswith("text/plain")
    queued = _value(before.text, 'flowbeat_jobs{status="queued"}')
    depth = _value(before.text, 'flowbeat_queue_depth{queue="flowbeat.steps"}')

    posted = client.post(
        "/v1/jobs", json={"pipeline": "greet", "params": {"who": "ada"}}, headers=writer
    )
    assert posted.status_code == 202, posted.text

    after = client.get("/metrics", headers=reader).text
    assert _value(after, 'flowbeat_jobs{status="queued"}') == queued + 1
    assert _value(after, 'flowbeat_queue_depth{queue="flowbeat.steps"}') == depth + 1
    assert _value(after, 'flowbeat_queue_depth{queue="flowbeat.control"}') >= 0
    assert _value(after, 'flowbeat_open_steps{status="pending"}') >= 1


def test_metrics_count_this_process_submissions_and_requests_by_route_template(
    client: TestClient, make_key: KeyFactory
) -> None:
    reader = {"Authorization": f"Bearer {make_key('read')}"}
    writer = {"Authorization": f"Bearer {make_key('write')}"}
    submitted = 'flowbeat_jobs_submitted_total{pipeline="greet",trigger="api"}'
    posts = (
        'flowbeat_api_request_duration_seconds_count{method="POST",route="/v1/jobs",status="2xx"}'
    )
    reads = (
        "flowbeat_api_request_duration_seconds_count"
        '{method="GET",route="/v1/jobs/{job_id}",status="2xx"}'
    )
    before = client.get("/metrics", headers=reader).text

    posted = client.post(
        "/v1/jobs", json={"pipeline": "greet", "params": {"who": "ada"}}, headers=writer
    )
    assert posted.status_code == 202, posted.text
    read = client.get(f"/v1/jobs/{posted.json()['job']['id']}", headers=writer)
    assert read.status_code == 200, read.text

    after = client.get("/metrics", headers=reader).text
    assert _counted(after, submitted) == _counted(before, submitted) + 1
    assert _counted(after, posts) == _counted(before, posts) + 1
    assert _counted(after, reads) == _counted(before, reads) + 1
    assert posted.json()["job"]["id"] not in after


def _counted(text: str, series: str) -> float:
    match = re.search(rf"^{re.escape(series)} (\S+)$", text, flags=re.M)
    return float(match.group(1)) if match else 0.0
