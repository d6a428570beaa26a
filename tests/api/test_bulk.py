"""POST /v1/jobs/cancel and /v1/jobs/rerun: every job a filter matches, in batches, each change
audited with the action's id, and a retry of the same action continuing rather than repeating."""

import uuid
from typing import Any

import redis
from fastapi.testclient import TestClient
from sqlalchemy import func, select, update

from service.engine.runtime import Runtime
from service.platform.db import unit_of_work
from service.platform.models import AuditEventRow, JobRow, StepRunRow
from service.platform.settings import Settings
from tests.api.conftest import KeyFactory
from tests.support.apps import api_client
from tests.support.arrange import walk

Headers = dict[str, str]


def _submit(client: TestClient, headers: Headers, **labels: str) -> str:
    body = {"pipeline": "greet", "params": {"who": "ada"}, "labels": labels}
    response = client.post("/v1/jobs", json=body, headers=headers)
    assert response.status_code == 202, response.text
    job_id: str = response.json()["job"]["id"]
    return job_id


def _failed_at_second(runtime: Runtime, job_ids: list[str]) -> None:
    """As a worker leaves a job whose second step failed: the first checkpointed."""
    with unit_of_work(runtime.sessions) as session:
        walk(session, JobRow, JobRow.id.in_(job_ids), to="failed")
        first = (StepRunRow.job_id.in_(job_ids), StepRunRow.step_id == "first")
        walk(session, StepRunRow, *first, to="succeeded")
        walk(
            session,
            StepRunRow,
            StepRunRow.job_id.in_(job_ids),
            StepRunRow.step_id == "second",
            to="failed",
        )
        session.execute(
            update(StepRunRow)
            .where(StepRunRow.job_id.in_(job_ids), StepRunRow.step_id == "first")
            .values(output={})
        )


def _statuses(runtime: Runtime, job_ids: list[str]) -> dict[str, str]:
    with unit_of_work(runtime.sessions) as session:
        rows = session.execute(select(JobRow.id, JobRow.status).where(JobRow.id.in_(job_ids)))
        return {str(job_id): status for job_id, status in rows}


def _audited(runtime: Runtime, action: str, job_ids: list[str]) -> list[tuple[str, Any]]:
    with unit_of_work(runtime.sessions) as session:
        rows = session.execute(
            select(AuditEventRow.target_id, AuditEventRow.detail).where(
                AuditEventRow.action == action, AuditEventRow.target_id.in_(job_ids)
            )
        )
        return sorted((target, detail.get("bulk_id")) for target, detail in rows)


def _reruns_of(runtime: Runtime, job_ids: list[str]) -> dict[str, int]:
    with unit_of_work(runtime.sessions) as session:
        rows = session.execute(
            select(JobRow.parent_job_id, func.count())
            .where(JobRow.parent_job_id.in_(job_ids), JobRow.trigger == "rerun")
            .group_by(JobRow.parent_job_id)
        )
        return {str(parent): count for parent, count in rows}


def test_a_dry_run_counts_the_jobs_and_lists_the_first_without_changing_any(
    client: TestClient, writer: Headers, runtime: Runtime
) -> None:
    acme = [_submit(client, writer, tenant="acme") for _ in range(3)]
    _submit(client, writer, tenant="globex")

    body = {"filter": {"labels": {"tenant": "acme"}}, "dry_run": True}
    response = client.post("/v1/jobs/cancel", json=body, headers=writer)

    assert response.status_code == 200, response.text
    assert response.json()["count"] == 3
    assert response.json()["job_ids"] == acme
    assert set(_statuses(runtime, acme).values()) == {"queued"}


def test_a_bulk_cancel_ends_every_open_job_it_matches_once_and_audits_each_with_its_id(
    settings: Settings, runtime: Runtime, writer: Headers
) -> None:
    small_batches = settings.model_copy(update={"bulk_batch_jobs": 2})
    with api_client(small_batches, runtime) as client:
        acme = [_submit(client, writer, tenant="acme") for _ in range(5)]
        globex = _submit(client, writer, tenant="globex")
        bulk_id = str(uuid.uuid4())
        body = {"id": bulk_id, "filter": {"labels": {"tenant": "acme"}, "status": ["queued"]}}

        first = client.post("/v1/jobs/cancel", json=body, headers=writer)
        again = client.post("/v1/jobs/cancel", json=body, headers=writer)

    assert first.status_code == 200, first.text
    bulk = first.json()["bulk"]
    assert (bulk["id"], bulk["status"], bulk["matched"], bulk["acted"]) == (bulk_id, "done", 5, 5)
    assert again.json()["bulk"] == bulk
    assert _statuses(runtime, [*acme, globex]) == {
        **dict.fromkeys(acme, "cancelled"),
        globex: "queued",
    }
    assert _audited(runtime, "job.cancel", acme) == sorted((job, bulk_id) for job in acme)


def test_an_id_given_again_with_another_filter_is_refused(
    client: TestClient, writer: Headers
) -> None:
    _submit(client, writer, tenant="acme")
    bulk_id = str(uuid.uuid4())
    body: dict[str, Any] = {"id": bulk_id, "filter": {"labels": {"tenant": "acme"}}}
    assert client.post("/v1/jobs/cancel", json=body, headers=writer).status_code == 200

    body["filter"] = {"labels": {"tenant": "globex"}}
    response = client.post("/v1/jobs/cancel", json=body, headers=writer)

    assert response.status_code == 409, response.text
    assert response.json()["error"]["code"] == "bulk_action_conflict"
    read = client.get(f"/v1/jobs/bulk/{bulk_id}", headers=writer)
    assert read.json()["filter"]["labels"] == {"tenant": "acme"}


def test_a_bulk_action_needs_a_filter_and_one_it_can_act_on(
    client: TestClient, writer: Headers
) -> None:
    empty = client.post("/v1/jobs/cancel", json={"filter": {}}, headers=writer)
    finished = client.post(
        "/v1/jobs/cancel", json={"filter": {"status": ["succeeded"]}}, headers=writer
    )

    for response in (empty, finished):
        assert response.status_code == 400, response.text
        assert response.json()["error"]["code"] == "job_filter_invalid"


def test_a_bulk_rerun_reruns_each_failed_job_once_from_its_failed_step_and_is_audited(
    client: TestClient, writer: Headers, runtime: Runtime, broker: redis.Redis
) -> None:
    failed = [_submit(client, writer, study="17") for _ in range(4)]
    _failed_at_second(runtime, failed)
    bulk_id = str(uuid.uuid4())
    body = {"id": bulk_id, "filter": {"labels": {"study": "17"}, "status": ["failed"]}}

    first = client.post("/v1/jobs/rerun", json=body, headers=writer)
    again = client.post("/v1/jobs/rerun", json=body, headers=writer)

    assert first.status_code == 200, first.text
    assert (first.json()["bulk"]["acted"], again.json()["bulk"]["acted"]) == (4, 4)
    assert _reruns_of(runtime, failed) == dict.fromkeys(failed, 1)
    assert _audited(runtime, "job.rerun", failed) == sorted((job, bulk_id) for job in failed)
    reruns = client.get(
        "/v1/jobs", params={"label": "study:17", "status": "queued"}, headers=writer
    )
    for job in reruns.json()["jobs"]:
        assert job["labels"] == {"study": "17"}
        assert [(s["step_id"], s["status"]) for s in job["steps"]] == [
            ("first", "reused"),
            ("second", "pending"),
        ]


def test_a_bulk_rerun_stops_at_the_owners_open_jobs_cap_and_a_retry_goes_on_from_there(
    settings: Settings, runtime: Runtime, make_key: KeyFactory
) -> None:
    headers = {"Authorization": f"Bearer {make_key('write')}"}
    capped = settings.model_copy(update={"max_open_jobs_per_owner": 3})
    with api_client(capped, runtime) as client:
        failed = [_submit(client, headers, batch="b1") for _ in range(3)]
        _failed_at_second(runtime, failed)
        _submit(client, headers, batch="other")
        body = {"id": str(uuid.uuid4()), "filter": {"labels": {"batch": "b1"}}}

        blocked = client.post("/v1/jobs/rerun", json=body, headers=headers)
        assert blocked.status_code == 429, blocked.text
        assert blocked.json()["error"]["details"]["bulk_id"] == body["id"]
        assert sum(_reruns_of(runtime, failed).values()) == 2
        with unit_of_work(runtime.sessions) as session:
            walk(session, JobRow, JobRow.parent_job_id.in_(failed), to="succeeded")
        done = client.post("/v1/jobs/rerun", json=body, headers=headers)

    assert done.status_code == 200, done.text
    assert done.json()["bulk"]["acted"] == 3
    assert _reruns_of(runtime, failed) == dict.fromkeys(failed, 1)


def test_bulk_reruns_take_their_turn_under_fair_share_at_their_jobs_priority(
    settings: Settings, runtime: Runtime, make_key: KeyFactory
) -> None:
    headers = {"Authorization": f"Bearer {make_key('write')}"}
    fair = settings.model_copy(update={"fair_share_ahead": 1})
    with api_client(fair, runtime) as client:
        failed = [_submit(client, headers, batch="fair") for _ in range(3)]
        _failed_at_second(runtime, failed)
        with unit_of_work(runtime.sessions) as session:
            session.execute(update(JobRow).where(JobRow.id.in_(failed)).values(priority=7))
        body = {"filter": {"labels": {"batch": "fair"}, "status": ["failed"]}}
        done = client.post("/v1/jobs/rerun", json=body, headers=headers)

    assert done.status_code == 200, done.text
    with unit_of_work(runtime.sessions) as session:
        reruns = session.execute(
            select(JobRow.priority, JobRow.waiting_for).where(JobRow.parent_job_id.in_(failed))
        ).all()
    assert sorted(priority for priority, _ in reruns) == [7, 7, 7]
    assert sum(waiting == "turn" for _, waiting in reruns) >= 2
