"""A schedule saved through the API reaches a sleeping beat leader at once, not at its next tick;
two schedules of one pipeline each fire once per fire time, with their own params and priority.

The leader runs with the default lock TTL and a slow sweeper, so between timed ticks it would
sleep ten seconds: any fire of a new schedule much later than its fire time came from that
sleep."""

import re
import socket
import uuid
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Row, select

from scheduler.lock import inspect
from service.platform.auth import create_api_key
from service.platform.constants import BEAT_LOCK_KEY
from service.platform.db import unit_of_work
from service.platform.models import JobRow
from tests.e2e.conftest import Client, Cluster, wait_for

FIRES = 3
TOKEN = "scrape-" + uuid.uuid4().hex
ON_TIME = timedelta(seconds=1)


@pytest.fixture
def api(client: Client) -> Iterator[TestClient]:
    from api.app import create_app
    from tasks.app import create_celery

    settings = client.settings.model_copy(update={"schedule_min_interval_s": 1})
    app = create_app(settings, runtime=client.rt, celery_app=create_celery(settings))
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


def _lags(client: Client, owner: str) -> list[timedelta]:
    with unit_of_work(client.rt.sessions) as session:
        rows = session.execute(
            select(JobRow.scheduled_for, JobRow.created_at)
            .where(JobRow.owner == owner)
            .order_by(JobRow.scheduled_for)
        ).all()
    return [created - fire for fire, created in rows if fire is not None]


def _exported(port: int) -> str:
    answer = httpx.get(
        f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5
    )
    return answer.text


def _value(text: str, series: str) -> float:
    match = re.search(rf"^{re.escape(series)} (\S+)$", text, flags=re.M)
    return float(match.group(1)) if match else 0.0


@pytest.mark.timeout(60)
def test_a_schedule_saved_while_the_leader_sleeps_fires_on_time_and_its_lag_is_exported(
    client: Client, cluster: Cluster, api: TestClient
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    cluster.beat(sweep_interval_s="60", beat_metrics_port=str(port), metrics_token=TOKEN)
    wait_for(lambda: inspect(client.broker, BEAT_LOCK_KEY).holder, 10, "a leader")
    owner = f"wakeup-{uuid.uuid4().hex[:6]}"
    with unit_of_work(client.rt.sessions) as session:
        key, _ = create_api_key(session, owner=owner, scopes=["write"])

    saved = api.put(
        "/v1/pipelines/slow/schedule",
        json={"every": "1s", "overlap": "allow", "params": {"hold_s": 0}},
        headers={"Authorization": f"Bearer {key}"},
    )

    assert saved.status_code == 200, saved.text
    lags = wait_for(lambda: len(found := _lags(client, owner)) >= FIRES and found, 20, "fires")
    api.delete("/v1/pipelines/slow/schedule", headers={"Authorization": f"Bearer {key}"})
    assert max(lags) < ON_TIME, f"late fires: {lags}"
    exported = _exported(port)
    assert _value(exported, 'flowbeat_beat_leader_changes_total{change="gained"}') == 1
    assert _value(exported, "flowbeat_beat_fire_lag_seconds_count") >= FIRES


@pytest.mark.timeout(60)
def test_two_schedules_of_one_pipeline_each_fire_once_per_fire_time_across_two_beats(
    client: Client, cluster: Cluster, api: TestClient
) -> None:
    cluster.beat(sweep_interval_s="60")
    cluster.beat(sweep_interval_s="60")
    wait_for(lambda: inspect(client.broker, BEAT_LOCK_KEY).holder, 10, "a leader")
    owner = f"several-{uuid.uuid4().hex[:6]}"
    with unit_of_work(client.rt.sessions) as session:
        key, _ = create_api_key(session, owner=owner, scopes=["write"])
    headers = {"Authorization": f"Bearer {key}"}
    ids: dict[uuid.UUID, tuple[float, int]] = {}
    for name, hold_s, priority in (("fast", 0, 9), ("gentle", 0.5, None)):
        body = {"name": name, "every": "1s", "overlap": "allow", "params": {"hold_s": hold_s}}
        saved = api.post(
            "/v1/pipelines/slow/schedules", json={**body, "priority": priority}, headers=headers
        )
        assert saved.status_code == 201, saved.text
        ids[uuid.UUID(saved.json()["schedule"]["id"])] = (hold_s, priority or 0)

    def fired() -> Sequence[Row[Any]] | None:
        with unit_of_work(client.rt.sessions) as session:
            rows = session.execute(
                select(
                    JobRow.schedule_id, JobRow.scheduled_for, JobRow.params, JobRow.priority
                ).where(JobRow.owner == owner)
            ).all()
        fewest = min(sum(1 for row in rows if row.schedule_id == each) for each in ids)
        return rows if fewest >= FIRES else None

    jobs = wait_for(fired, 20, "fires of both schedules")
    for schedule_id in ids:
        gone = api.delete(f"/v1/pipelines/slow/schedules/{schedule_id}", headers=headers)
        assert gone.status_code == 204

    assert all((job.params["hold_s"], job.priority) == ids[job.schedule_id] for job in jobs)
    fires = [(job.schedule_id, job.scheduled_for) for job in jobs]
    assert len(fires) == len(set(fires)), "a schedule fired twice for one fire time"
