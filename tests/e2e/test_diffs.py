"""Two runs of a profile on a real worker: the second is diffed against the first, and a
diff-mode run with new items sends a signed webhook that survives a 503."""

import json
import uuid
from typing import Any

from service.catalogue.diffs import DiffKind, diff_counts, diff_page
from service.engine.events import notice_events
from service.engine.submission import JobRequest, submit_job
from service.language.plan import load_plan
from service.platform.db import unit_of_work
from service.platform.models import JobRow
from tasks.dispatch import publish_new_job
from tests.e2e.conftest import Client, Cluster, wait_for
from tests.support.webhook import WebhookServer

SECRET = "e2e-secret"


def _submit(client: Client, owner: str, pmids: list[int], **extra: Any) -> uuid.UUID:
    papers = [{"pmid": pmid, "title": f"paper {pmid}"} for pmid in pmids]
    with unit_of_work(client.rt.sessions) as session:
        job, _ = submit_job(
            session,
            JobRequest(pipeline="watchlist", params={"papers": papers}, **extra),
            owner=owner,
            profiles_dir=client.settings.profiles_dir,
            known_actions=client.rt.registry.names(),
        )
    with unit_of_work(client.rt.sessions) as session:
        plan = load_plan(session, job.id)
    assert plan is not None
    publish_new_job(client.app, client.rt, plan)
    return job.id


def _job(client: Client, job_id: uuid.UUID) -> JobRow:
    with unit_of_work(client.rt.sessions) as session:
        job = session.get(JobRow, job_id)
        assert job is not None
        return job


def _events(client: Client, job_id: uuid.UUID) -> list[str]:
    with unit_of_work(client.rt.sessions) as session:
        return [event.kind for event in notice_events(session, job_id)]


def test_two_runs_on_a_worker_are_diffed_and_new_items_are_notified(
    cluster: Cluster, client: Client
) -> None:
    cluster.worker(webhook_secret=SECRET, notify_backoff_s="0.2")
    owner = f"e2e-diff-{uuid.uuid4().hex[:6]}"
    with WebhookServer([503, 200]) as hook:
        first = _submit(client, owner, [1, 2, 3])
        assert client.wait_final(first).job.status == "succeeded"
        second = _submit(client, owner, [2, 3, 4, 5], diff_mode=True, notify_url=hook.url)
        assert client.wait_final(second).job.status == "succeeded"
        wait_for(lambda: "notified" in _events(client, second), 30, "the notice to arrive")
        received = hook.received

    job = _job(client, second)
    assert job.previous_job_id == first
    assert (job.item_count, job.new_count, job.removed_count) == (4, 2, 1)
    with unit_of_work(client.rt.sessions) as session:
        assert diff_counts(session, job).as_dict() == {"new": 2, "removed": 1, "unchanged": 2}
        new = diff_page(session, job, DiffKind.NEW, limit=10).items
    assert [item["pmid"] for item in new] == [4, 5]
    assert _events(client, second) == ["new_items", "notified"]

    assert len(received) == 2
    last = received[-1]
    assert last.signed_with(SECRET)
    payload = json.loads(last.body)
    assert payload["job_id"] == str(second)
    assert payload["counts"] == {"items": 4, "new": 2, "removed": 1}
    assert [item["pmid"] for item in payload["new_items"]] == [4, 5]


def test_a_diff_mode_run_without_new_items_sends_nothing(cluster: Cluster, client: Client) -> None:
    cluster.worker(webhook_secret=SECRET)
    owner = f"e2e-quiet-{uuid.uuid4().hex[:6]}"
    with WebhookServer([200]) as hook:
        first = _submit(client, owner, [1, 2])
        client.wait_final(first)
        second = _submit(client, owner, [2, 1], diff_mode=True, notify_url=hook.url)
        view = client.wait_final(second)
        received = hook.received

    assert view.job.status == "succeeded"
    assert view.job.result["no_new_items"] is True
    assert _events(client, second) == []
    assert received == []
