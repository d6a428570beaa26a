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
    assert _value(after, 'flowbeat_open_steps{status="pending"}') >= 1
