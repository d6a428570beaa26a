"""Retention seen through the API: a job is readable until the minimum age has passed, then
answers 410 job_expired, never 404."""

import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from service.catalogue.retention import RetentionPolicy, prune_all
from service.engine.runner import run_step
from service.engine.runtime import Runtime
from service.engine.steps import StepKey
from service.platform.auth import create_api_key
from service.platform.db import unit_of_work
from service.platform.models import JobRow
from service.platform.settings import Settings
from tests.conftest import Stack
from tests.support.apps import api_client
from tests.support.servers import private_database

ONE_STEP = {"name": "many", "steps": [{"id": "only", "action": "noop"}]}
POLICY = RetentionPolicy(keep=100, min_age_s=2)
"""The minimum age counted from the last of the 150 to finish: however slowly the machine ran
them, none is old when the last one ends."""


@pytest.fixture(scope="module")
def own(stack: Stack, profiles_dir: Path) -> Iterator[tuple[Runtime, TestClient]]:
    """A database of its own: a pass prunes every owner's runs, other tests' included. No rate
    limit: a client reading 150 jobs back at once is what the test is about."""
    with private_database("flowbeat_api_retention") as url:
        settings = Settings(
            database_url=url,
            broker_url=stack.broker_url,
            profiles_dir=profiles_dir,
            rate_limit_per_s=0,
        )
        rt = Runtime.start(settings)
        with api_client(settings, rt) as client:
            yield rt, client
        rt.sessions.kw["bind"].dispose()


def test_150_runs_are_all_readable_then_the_oldest_50_expire(
    own: tuple[Runtime, TestClient],
) -> None:
    rt, client = own
    with unit_of_work(rt.sessions) as session:
        token, _ = create_api_key(session, owner="batch", scopes=["read", "write"])
    headers = {"Authorization": f"Bearer {token}"}
    ids = []
    for _ in range(150):
        answer = client.post("/v1/jobs", json={"pipeline": ONE_STEP, "params": {}}, headers=headers)
        assert answer.status_code == 202
        ids.append(answer.json()["job"]["id"])
    for job_id in ids:
        run_step(rt, StepKey(uuid.UUID(job_id), "only"), task_id=uuid.uuid4().hex)

    reads = [client.get(f"/v1/jobs/{job_id}", headers=headers) for job_id in ids]
    assert {r.status_code for r in reads} == {200}, [r.json() for r in reads if r.is_error][:1]
    assert [r.json()["job"]["status"] for r in reads] == ["succeeded"] * 150
    with unit_of_work(rt.sessions) as session:
        first, last = session.execute(
            select(func.min(JobRow.finished_at), func.max(JobRow.finished_at))
        ).one()
        assert first is not None and last is not None
        policy = replace(POLICY, min_age_s=(last - first).total_seconds() + POLICY.min_age_s)
        assert prune_all(session, last, policy) == 0, "a run that just finished is not pruned"

    with unit_of_work(rt.sessions) as session:
        assert prune_all(session, last + timedelta(seconds=policy.min_age_s + 1), policy) == 50

    gone = [client.get(f"/v1/jobs/{job_id}", headers=headers) for job_id in ids[:50]]
    kept = [client.get(f"/v1/jobs/{job_id}", headers=headers) for job_id in ids[50:]]
    assert {r.status_code for r in gone} == {410}
    assert {r.json()["error"]["code"] for r in gone} == {"job_expired"}
    assert all(r.json()["error"]["details"]["pruned_at"] for r in gone)
    assert all(r.json()["error"]["details"]["finished_at"] for r in gone)
    assert {r.status_code for r in kept} == {200}
    events = client.get(f"/v1/jobs/{ids[0]}/events", headers=headers)
    diff = client.get(f"/v1/jobs/{ids[0]}/diff", headers=headers)
    assert (events.status_code, diff.status_code) == (410, 410)
    with unit_of_work(rt.sessions) as session:
        token, _ = create_api_key(session, owner="someone-else", scopes=["read"])
    other = client.get(f"/v1/jobs/{ids[0]}", headers={"Authorization": f"Bearer {token}"})
    assert other.json()["error"]["code"] == "job_not_found"
