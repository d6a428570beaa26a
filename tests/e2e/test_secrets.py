"""Secrets on real processes: a prefork worker and the API, both given a mounted directory of
secrets, run a job whose http.request step sends an owner's secret as a bearer header to a
server this test starts, which refuses anything else and echoes what it got. Then the value is
looked for everywhere it must not be: every row of every table of the test database, every key
and value of the test's Redis DB, every answer of the API and the dashboard about the job, and
the worker's and the API's own output. It is found only where it was meant to go."""

import json
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import redis
from psycopg import sql

from service.platform.auth import create_api_key
from service.platform.db import libpq_url, unit_of_work
from tests.conftest import Stack
from tests.e2e.conftest import FINAL, Client, Cluster, wait_for

TOKEN = f"tok-{uuid.uuid4().hex}"
SECRET = "E2E_TOKEN"


class _Checking(BaseHTTPRequestHandler):
    """200 only with the bearer token, echoing it in the body and a header, as a careless
    service would; 400 echoing the request line on ``/refuse``."""

    seen: list[tuple[str, str]] = []

    def do_GET(self) -> None:
        auth = self.headers.get("Authorization", "")
        self.seen.append((self.path.split("?")[0], auth))
        if self.path.startswith("/refuse"):
            self._answer(400, {"error": f"no to {self.path}"})
        elif auth != f"Bearer {TOKEN}":
            self._answer(401, {"error": "unauthorized"})
        else:
            self._answer(200, {"items": [{"id": 1, "seen": auth}]}, echo=auth)

    def _answer(self, status: int, body: dict[str, Any], echo: str = "") -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if echo:
            self.send_header("X-Seen", echo)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        return


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Checking)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _profile(base: str) -> dict[str, Any]:
    bearer = {"Authorization": f"Bearer ${{{{ secrets.{SECRET} }}}}"}
    return {
        "name": "secret-e2e",
        "steps": [
            {
                "id": "call",
                "action": "http.request",
                "with": {"url": f"{base}/items?key=${{{{ secrets.{SECRET} }}}}", "headers": bearer},
            },
            {
                "id": "say",
                "action": "drill.chatter",
                "depends_on": ["call"],
                "with": {"say": f"printing ${{{{ secrets.{SECRET} }}}}"},
            },
        ],
        "result": {"step": "call", "items": "json.items", "key": "id"},
    }


def _refusing(base: str) -> dict[str, Any]:
    url = f"{base}/refuse?key=${{{{ secrets.{SECRET} }}}}"
    return {
        "name": "secret-e2e-fails",
        "steps": [{"id": "call", "action": "http.request", "with": {"url": url}}],
    }


def _database_text(database_url: str) -> str:
    """Every row of every table, each as PostgreSQL prints a row."""
    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        tables = conn.execute(
            "SELECT table_schema, table_name FROM information_schema.tables"
            " WHERE table_type = 'BASE TABLE'"
            " AND table_schema NOT IN ('pg_catalog', 'information_schema')"
        ).fetchall()
        assert len(tables) > 10
        rows = []
        for schema, table in tables:
            query = sql.SQL("SELECT t::text FROM {}.{} AS t").format(
                sql.Identifier(schema), sql.Identifier(table)
            )
            rows += [row[0] for row in conn.execute(query)]
    return "\n".join(rows)


def _redis_value(client: redis.Redis, key: bytes, kind: str) -> Any:
    if kind == "string":
        return client.get(key)
    if kind == "list":
        return client.lrange(key, 0, -1)
    if kind == "hash":
        return client.hgetall(key)
    if kind == "set":
        return client.smembers(key)
    if kind == "zset":
        return client.zrange(key, 0, -1, withscores=True)
    assert kind == "stream", kind
    return client.xrange(key)


def _redis_text(broker_url: str) -> str:
    """Every key of the test's Redis DB with its value, whatever its type."""
    client = redis.Redis.from_url(broker_url)
    parts: list[Any] = []
    try:
        for key in client.scan_iter(count=1000):
            raw = client.type(key)
            kind = raw.decode() if isinstance(raw, bytes) else raw
            parts += [key, kind, _redis_value(client, key, kind)]
    finally:
        client.close()
    return repr(parts)


def _final(api: str, headers: dict[str, str], job_id: str) -> dict[str, Any]:
    def answer() -> dict[str, Any] | None:
        job: dict[str, Any] = httpx.get(f"{api}/v1/jobs/{job_id}", headers=headers).json()["job"]
        return job if job["status"] in FINAL else None

    found: dict[str, Any] = wait_for(answer, 60, f"job {job_id} to finish")
    return found


def _api_text(api: str, key: str, jobs: list[dict[str, Any]]) -> str:
    """Every answer about the jobs: the job, the lists, events, each step's log, the diff,
    and the dashboard's pages of them; each a 200 but the diff of the job that failed."""
    headers = {"Authorization": f"Bearer {key}"}
    ndjson = {**headers, "Accept": "application/x-ndjson"}
    cookies = {"flowbeat_key": key}
    answers = [httpx.get(f"{api}/v1/jobs", headers=headers, timeout=30)]
    answers.append(httpx.get(f"{api}/v1/pipelines/secret-e2e/runs", headers=headers, timeout=30))
    for job in jobs:
        steps = [step["step_id"] for step in job["steps"]]
        paths = [f"/v1/jobs/{job['id']}", f"/v1/jobs/{job['id']}/diff"]
        paths += [f"/v1/jobs/{job['id']}/steps/{step}/logs" for step in steps]
        answers += [httpx.get(f"{api}{path}", headers=headers, timeout=30) for path in paths]
        events = f"{api}/v1/jobs/{job['id']}/events"
        answers.append(httpx.get(events, headers=ndjson, timeout=30))
        ui = [f"/ui/jobs/{job['id']}", f"/ui/jobs/{job['id']}/panel", "/ui/jobs"]
        ui += [f"/ui/jobs/{job['id']}/steps/{step}/logs" for step in steps]
        answers += [httpx.get(f"{api}{path}", cookies=cookies, timeout=30) for path in ui]
    statuses = {(a.url.path, a.status_code) for a in answers if a.status_code != 200}
    assert statuses == {(f"/v1/jobs/{jobs[1]['id']}/diff", 409)}, statuses
    return "\n".join(a.text for a in answers)


def test_a_secret_reaches_the_server_and_nothing_else(
    stack: Stack, cluster: Cluster, client: Client, server: str, tmp_path: Path
) -> None:
    owner = f"sec-{uuid.uuid4().hex[:8]}"
    secrets = tmp_path / "secrets"
    (secrets / owner).mkdir(parents=True)
    (secrets / owner / SECRET).write_text(TOKEN + "\n")
    worker = cluster.worker(concurrency=2, secrets_dir=str(secrets))
    api = cluster.api(secrets_dir=str(secrets))
    with unit_of_work(client.rt.sessions) as session:
        key, _ = create_api_key(session, owner=owner, scopes=["read", "write"])
    headers = {"Authorization": f"Bearer {key}"}

    job_ids = []
    for document in (_profile(server), _refusing(server)):
        answer = httpx.post(f"{api}/v1/jobs", json={"pipeline": document}, headers=headers)
        assert answer.status_code == 202, answer.text
        job_ids.append(answer.json()["job"]["id"])
    jobs = [_final(api, headers, job_id) for job_id in job_ids]

    assert [job["status"] for job in jobs] == ["succeeded", "failed"]
    assert sorted(_Checking.seen) == [("/items", f"Bearer {TOKEN}"), ("/refuse", "")]
    assert jobs[0]["result"]["items"] == [{"id": 1, "seen": "Bearer ***"}]
    error = jobs[1]["steps"][0]["error"]
    assert error["message"].endswith("/refuse?key=*** returned HTTP 400")
    assert error["details"]["body"] == json.dumps({"error": "no to /refuse?key=***"})
    shown = _api_text(api, key, jobs)
    assert "Bearer ***" in shown and "printing ***" in shown
    logs = worker.output() + "\n".join(proc.output() for proc in cluster.procs)
    assert "key=***" in logs
    for where, text in {
        "database": _database_text(stack.database_url),
        "redis": _redis_text(stack.broker_url),
        "api": shown,
        "process logs": logs,
    }.items():
        assert TOKEN not in text, f"the secret's value is in the {where}"
