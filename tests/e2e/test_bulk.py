"""Bulk actions on real processes: a bulk cancel of 500 running jobs through a live API while a
worker is SIGKILLed under the compensations it sends, and a bulk rerun whose API process is
killed halfway and retried.

The running jobs wait in a ``wait`` step, holding no worker, as most of a backfill's open jobs
would; a step that follows another runs in the same message, so a held step would keep all but
the first few jobs queued."""

import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from service.platform.auth import create_api_key
from service.platform.db import unit_of_work
from service.platform.models import (
    AuditEventRow,
    BulkActionRow,
    CompensationRow,
    JobEventRow,
    JobRow,
    StepRunRow,
)
from tests.e2e.conftest import FINAL, Client, Cluster, wait_for

HOLDING = {
    "name": "bulk-holding",
    "steps": [
        {
            "id": "reserve",
            "action": "drill.work",
            "with": {"value": "reserve"},
            "compensate": {"action": "drill.work", "with": {"value": "unreserve"}},
        },
        {"id": "hold", "action": "wait", "depends_on": ["reserve"], "with": {"seconds": 3600}},
    ],
}
FAILING = {
    "name": "bulk-failing",
    "steps": [
        {"id": "load", "action": "drill.work", "with": {"value": "load"}},
        {
            "id": "fetch",
            "action": "fail",
            "depends_on": ["load"],
            "with": {"message": "503 from upstream", "retryable": False},
        },
    ],
}


def _headers(client: Client, owner: str) -> dict[str, str]:
    with unit_of_work(client.rt.sessions) as session:
        key, _ = create_api_key(session, owner=owner, scopes=("write",))
    return {"Authorization": f"Bearer {key}"}


def _count(client: Client, *where: Any) -> int:
    with unit_of_work(client.rt.sessions) as session:
        return int(session.scalar(select(func.count()).select_from(JobRow).where(*where)) or 0)


def _acted(client: Client, bulk_id: str) -> int:
    with unit_of_work(client.rt.sessions) as session:
        row = session.get(BulkActionRow, uuid.UUID(bulk_id))
        return 0 if row is None else row.acted


def _per_job(client: Client, query: Any) -> Counter[str]:
    with unit_of_work(client.rt.sessions) as session:
        return Counter(str(value) for value in session.scalars(query))


@pytest.mark.timeout(900)  # 500 jobs and their compensations on a shared machine
def test_a_bulk_cancel_of_500_running_jobs_survives_a_worker_killed_under_it(
    cluster: Cluster, client: Client
) -> None:
    doomed, survivor = cluster.worker(concurrency=4), cluster.worker(concurrency=4)
    cluster.beat()
    base = cluster.api(bulk_batch_jobs="50")
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    jobs = [client.submit_at(None, HOLDING, labels={"tenant": tenant}) for _ in range(500)]
    running = (JobRow.id.in_(jobs), JobRow.status == "running")
    wait_for(lambda: _count(client, *running) == 500, 240, "500 jobs running")
    bulk_id = str(uuid.uuid4())
    body = {"id": bulk_id, "filter": {"labels": {"tenant": tenant}, "status": ["running"]}}

    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(
            httpx.post,
            f"{base}/v1/jobs/cancel",
            json=body,
            headers=_headers(client, "tests"),
            timeout=300,
        )
        wait_for(lambda: _acted(client, bulk_id) > 0, 60, "the first batch")
        doomed.kill_whole()
        response = answer.result()

    assert response.status_code == 200, response.text
    assert response.json()["bulk"]["acted"] == 500
    assert survivor.popen.poll() is None
    wait_for(lambda: client.settled_at(jobs), 600, "every job and compensation settled")
    assert _count(client, JobRow.id.in_(jobs), JobRow.status == "cancelled") == 500
    open_steps = select(StepRunRow.job_id).where(
        StepRunRow.job_id.in_(jobs), StepRunRow.status.in_(("running", "pending", "retrying"))
    )
    assert _per_job(client, open_steps) == Counter()
    cancels = select(AuditEventRow.target_id).where(
        AuditEventRow.action == "job.cancel",
        AuditEventRow.target_id.in_([str(job) for job in jobs]),
        AuditEventRow.detail["bulk_id"].astext == bulk_id,
    )
    assert _per_job(client, cancels) == Counter({str(job): 1 for job in jobs})
    ended = select(JobEventRow.job_id).where(
        JobEventRow.job_id.in_(jobs), JobEventRow.kind == "job.cancelled"
    )
    assert _per_job(client, ended) == Counter({str(job): 1 for job in jobs})
    undone = select(CompensationRow.job_id).where(
        CompensationRow.job_id.in_(jobs), CompensationRow.status == "compensated"
    )
    assert _per_job(client, undone) == Counter({str(job): 1 for job in jobs})


@pytest.mark.timeout(900)  # 300 jobs failed, then rerun and run again
def test_a_bulk_rerun_cut_short_by_an_api_restart_and_retried_reruns_each_job_once(
    cluster: Cluster, client: Client
) -> None:
    cluster.worker(concurrency=4)
    cluster.beat()
    settings = {"bulk_batch_jobs": "10"}
    first_api = cluster.api(**settings)
    api_process = cluster.procs[-1]
    study = f"s-{uuid.uuid4().hex[:8]}"
    jobs = [client.submit_at(None, FAILING, labels={"study": study}) for _ in range(300)]
    wait_for(
        lambda: _count(client, JobRow.id.in_(jobs), JobRow.status == "failed") == 300,
        240,
        "300 failed jobs",
    )
    bulk_id = str(uuid.uuid4())
    body = {"id": bulk_id, "filter": {"labels": {"study": study}, "error_code": "action_failed"}}
    headers = _headers(client, "tests")

    with ThreadPoolExecutor(1) as pool:
        cut = pool.submit(
            httpx.post, f"{first_api}/v1/jobs/rerun", json=body, headers=headers, timeout=300
        )
        wait_for(lambda: _acted(client, bulk_id) >= 100, 120, "a third of the reruns")
        api_process.kill_whole()
        assert isinstance(cut.exception(), httpx.HTTPError)
    halfway = _acted(client, bulk_id)
    response = httpx.post(
        f"{cluster.api(**settings)}/v1/jobs/rerun", json=body, headers=headers, timeout=300
    )

    assert response.status_code == 200, response.text
    assert 100 <= halfway < 300
    assert response.json()["bulk"]["acted"] == 300
    reruns = select(JobRow.parent_job_id).where(
        JobRow.parent_job_id.in_(jobs), JobRow.trigger == "rerun"
    )
    assert _per_job(client, reruns) == Counter({str(job): 1 for job in jobs})
    audited = select(AuditEventRow.target_id).where(
        AuditEventRow.action == "job.rerun", AuditEventRow.detail["bulk_id"].astext == bulk_id
    )
    assert _per_job(client, audited) == Counter({str(job): 1 for job in jobs})
    rerun_ids = select(JobRow.id).where(JobRow.parent_job_id.in_(jobs))
    with unit_of_work(client.rt.sessions) as session:
        children = list(session.scalars(rerun_ids))
    wait_for(
        lambda: _count(client, JobRow.id.in_(children), JobRow.status.in_(FINAL)) == 300,
        240,
        "every rerun to run, those a killed API never sent too",
    )
    reused = select(StepRunRow.job_id).where(
        StepRunRow.job_id.in_(children), StepRunRow.step_id == "load", StepRunRow.status == "reused"
    )
    assert len(_per_job(client, reused)) == 300
