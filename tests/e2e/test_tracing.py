"""One trace per job, exported over OTLP to a receiver the test starts: from the client's
request through the API's submission, every step's attempt (a retried one twice) to the
outbound call the last step makes, which passes the trace on; and the worker's log lines
about the job carry its trace id."""

import json
import secrets
import uuid
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from service.platform.auth import create_api_key
from service.platform.db import unit_of_work
from service.platform.models import JobRow
from tests.e2e.conftest import Client, Cluster, wait_for
from tests.support.otlp import Collector, ReceivedSpan, otlp_receiver
from tests.support.webhook import WebhookServer

EXPORT_EVERY_MS = "100"


def _chain(url: str) -> dict[str, Any]:
    return {
        "name": "traced",
        "steps": [
            {"id": "a", "action": "drill.count", "with": {"name": "a"}},
            {"id": "b", "action": "drill.count", "with": {"name": "b"}, "depends_on": ["a"]},
            {
                "id": "call",
                "action": "http.request",
                "depends_on": ["b"],
                "with": {"url": url, "method": "POST", "json": {"hello": "there"}},
                "retry": {"attempts": 2, "backoff_s": 0.1},
            },
        ],
    }


def _names(spans: list[ReceivedSpan]) -> list[str]:
    return sorted(span.name for span in spans)


@pytest.mark.timeout(120)
def test_a_job_is_one_trace_from_the_request_to_its_outbound_call(
    client: Client, cluster: Cluster
) -> None:
    with otlp_receiver() as (endpoint, collector), WebhookServer([503, 200]) as hook:
        cluster.env.update(
            OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_BSP_SCHEDULE_DELAY=EXPORT_EVERY_MS
        )
        api = cluster.api()
        worker = cluster.worker(concurrency=1)
        with unit_of_work(client.rt.sessions) as session:
            key, _ = create_api_key(session, owner="traced", scopes=["read", "write"])
        trace_id = secrets.token_hex(16)
        answer = httpx.post(
            f"{api}/v1/jobs",
            json={"pipeline": _chain(hook.url)},
            headers={
                "Authorization": f"Bearer {key}",
                "traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01",
            },
            timeout=30,
        )
        assert answer.status_code == 202, answer.text
        job_id = uuid.UUID(answer.json()["job"]["id"])
        assert client.wait_final(job_id, timeout_s=60).job.status == "succeeded"

        wanted = {"step a", "step b", "step call", "HTTP POST"}
        spans = wait_for(
            lambda: (
                (got := collector.of_trace(trace_id))
                and wanted <= {s.name for s in got}
                and _names(got).count("step call") == 2
                and got
            ),
            30,
            "every span of the job's trace",
        )
        cluster.close()  # while the receiver answers: an exporter left without one retries at exit

    by_service = {span.service for span in spans}
    assert by_service == {"flowbeat-api", "flowbeat-worker"}
    steps = {span.span_id for span in spans if span.name.startswith("step ")}
    statements = [s for s in spans if s.attributes.get("db.system") == "postgresql"]
    assert any(s.parent_id in steps for s in statements), "a step's checkpoint is a span of it"
    assert "job.submit" in _names(spans)
    assert _names(spans).count("HTTP POST") == 2, "one outbound call an attempt"
    submit = next(span for span in spans if span.name == "job.submit")
    assert submit.attributes["job_id"] == str(job_id)
    attempts = sorted(s.attributes["attempt"] for s in spans if s.name == "step call")
    assert attempts == [1, 2]
    ids = {span.span_id for span in spans}
    assert all(span.parent_id in ids for span in spans if span.service == "flowbeat-worker")
    passed_on = {h.headers.get("traceparent", "").split("-")[1] for h in hook.received}
    assert passed_on == {trace_id}, "the called server sees the job's trace"
    lines = [json.loads(line) for line in worker.output().splitlines() if line.startswith("{")]
    about = [line for line in lines if line.get("job_id") == str(job_id)]
    assert about and all(line.get("trace_id") == trace_id for line in about)


def _pausing() -> dict[str, Any]:
    return {
        "name": "traced-pause",
        "steps": [
            {"id": "first", "action": "drill.count", "with": {"name": "first"}},
            {"id": "pause", "action": "wait", "with": {"seconds": 1}, "depends_on": ["first"]},
            {
                "id": "after",
                "action": "drill.count",
                "with": {"name": "after"},
                "depends_on": ["pause"],
            },
        ],
    }


def _job_of_schedule(client: Client, owner: str) -> uuid.UUID | None:
    with unit_of_work(client.rt.sessions) as session:
        return session.scalar(
            select(JobRow.id)
            .where(JobRow.owner == owner, JobRow.schedule_id.is_not(None))
            .where(JobRow.status == "succeeded")
            .limit(1)
        )


def _trace_of_step(collector: Collector, job_id: uuid.UUID, step: str) -> str | None:
    with collector.lock:
        return next(
            (
                s.trace_id
                for s in collector.spans
                if s.name == f"step {step}" and s.attributes.get("job_id") == str(job_id)
            ),
            None,
        )


@pytest.mark.timeout(150)
def test_steps_the_beat_sends_stay_in_the_trace_their_job_began_in(
    client: Client, cluster: Cluster
) -> None:
    """The step after a durable wait is sent by the beat leader, and a scheduled job begins in
    the leader's fire: neither starts a trace of its own."""
    with otlp_receiver() as (endpoint, collector):
        cluster.env.update(
            OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_BSP_SCHEDULE_DELAY=EXPORT_EVERY_MS
        )
        api = cluster.api(schedule_min_interval_s="1")
        cluster.worker(concurrency=1)
        cluster.beat()
        owner = f"traced-{uuid.uuid4().hex[:6]}"
        with unit_of_work(client.rt.sessions) as session:
            key, _ = create_api_key(session, owner=owner, scopes=["read", "write"])
        auth = {"Authorization": f"Bearer {key}"}
        trace_id = secrets.token_hex(16)
        answer = httpx.post(
            f"{api}/v1/jobs",
            json={"pipeline": _pausing()},
            headers={**auth, "traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"},
            timeout=30,
        )
        assert answer.status_code == 202, answer.text
        paused = uuid.UUID(answer.json()["job"]["id"])
        assert client.wait_final(paused, timeout_s=60).job.status == "succeeded"
        wait_for(lambda: _trace_of_step(collector, paused, "after"), 30, "the step after the wait")
        assert _trace_of_step(collector, paused, "after") == trace_id

        saved = httpx.put(
            f"{api}/v1/pipelines/slow/schedule",
            json={"every": "1s", "overlap": "skip", "params": {"hold_s": 0}},
            headers=auth,
            timeout=30,
        )
        assert saved.status_code == 200, saved.text
        scheduled = wait_for(lambda: _job_of_schedule(client, owner), 60, "a scheduled job")
        httpx.delete(f"{api}/v1/pipelines/slow/schedule", headers=auth, timeout=30)
        fired = wait_for(
            lambda: _trace_of_step(collector, scheduled, "after"), 30, "the scheduled job's spans"
        )
        spans = wait_for(
            lambda: (
                (got := collector.of_trace(fired))
                and {"schedule.fire", "step before", "step slow", "step after"}
                <= {s.name for s in got}
                and got
            ),
            30,
            "the fire and every step in one trace",
        )
        cluster.close()  # while the receiver answers: an exporter left without one retries at exit
    assert {s.service for s in spans if s.name == "schedule.fire"} == {"flowbeat-beat"}
