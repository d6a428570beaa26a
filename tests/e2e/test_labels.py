"""A filtered list over 10,000 labelled jobs, from a live API: every job the filter matches,
page after page, and none it does not."""

import uuid
from typing import Any

import httpx
from sqlalchemy import text

from service.platform.auth import create_api_key
from service.platform.db import unit_of_work
from service.platform.models import JobRow
from tests.e2e.conftest import Client, Cluster
from tests.support.arrange import walk

JOBS = 10_000
COPIES = """
INSERT INTO jobs (id, owner, pipeline, profile_hash, params, status, trigger, priority,
                  queue, request_hash, created_at, finished_at, labels, error)
SELECT gen_random_uuid(), t.owner, t.pipeline, t.profile_hash, t.params,
       'queued', 'api', 0, t.queue,
       t.request_hash, now() - make_interval(secs => n), now() - make_interval(secs => n),
       jsonb_build_object('tenant', 't' || n % 50, 'study', (n % 7)::text),
       CASE WHEN n % 3 = 0 THEN jsonb_build_object('code', 'http_status', 'message', '503')
       END
  FROM jobs AS t, generate_series(1, :jobs) AS n
 WHERE t.id = :template
"""


def _all_pages(base: str, headers: dict[str, str], **query: Any) -> list[str]:
    found: list[str] = []
    params: dict[str, Any] = {**query, "limit": 200}
    while True:
        page = httpx.get(f"{base}/v1/jobs", params=params, headers=headers, timeout=30)
        assert page.status_code == 200, page.text
        found += [job["id"] for job in page.json()["jobs"]]
        if page.json()["next_cursor"] is None:
            return found
        params["cursor"] = page.json()["next_cursor"]


def _expected(client: Client, owner: str, where: str) -> list[str]:
    with unit_of_work(client.rt.sessions) as session:
        rows = session.execute(
            text(
                f"SELECT id FROM jobs WHERE owner = :owner AND {where} "
                "ORDER BY created_at DESC, id DESC"
            ),
            {"owner": owner},
        )
        return [str(row[0]) for row in rows]


def test_a_label_filter_over_10000_jobs_lists_exactly_the_jobs_with_every_label(
    cluster: Cluster, client: Client
) -> None:
    owner = f"labels-{uuid.uuid4().hex[:8]}"
    with unit_of_work(client.rt.sessions) as session:
        key, _ = create_api_key(session, owner=owner, scopes=("write",))
    headers = {"Authorization": f"Bearer {key}"}
    base = cluster.api()
    body = {"pipeline": "rerun", "params": {}, "labels": {"tenant": "t7", "study": "0"}}
    template = httpx.post(f"{base}/v1/jobs", json=body, headers=headers).json()["job"]["id"]
    assert httpx.post(f"{base}/v1/jobs/{template}/cancel", headers=headers).status_code == 200
    with unit_of_work(client.rt.sessions) as session:
        session.execute(text(COPIES), {"jobs": JOBS, "template": template})
        copies = (JobRow.owner == owner, JobRow.status == "queued")
        walk(session, JobRow, *copies, JobRow.error.is_not(None), to="failed")
        walk(session, JobRow, *copies, to="succeeded")

    both = _all_pages(base, headers, label=["tenant:t7", "study:0"])
    failed = _all_pages(base, headers, label="tenant:t7", error_code="http_status")

    assert both == _expected(client, owner, 'labels @> \'{"tenant": "t7", "study": "0"}\'')
    assert template in both and len(both) > 20
    assert failed == _expected(
        client, owner, "labels @> '{\"tenant\": \"t7\"}' AND error->>'code' = 'http_status'"
    )
    assert len(failed) == len(set(failed)) > 0
