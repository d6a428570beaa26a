"""GET /v1/jobs/{id}/diff: counts and keyset-paged items against the previous successful run."""

import uuid
from collections.abc import Callable
from typing import Any

from fastapi.testclient import TestClient

from service.engine.runtime import Runtime
from tests.api.conftest import GREET, KeyFactory
from tests.support.runs import run_items


def _auth(make_key: KeyFactory, owner: str, *scopes: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {make_key(*(scopes or ('read',)), owner=owner)}"}


def _items(*keys: str) -> list[dict[str, Any]]:
    return [{"id": key} for key in keys]


def test_the_diff_lists_counts_and_one_page_of_items(
    client: TestClient, runtime: Runtime, make_key: KeyFactory
) -> None:
    owner = f"diff-{uuid.uuid4().hex[:8]}"
    first = run_items(runtime, _items("a", "b", "c"), owner=owner, pipeline="lit")
    second = run_items(runtime, _items("b", "c", "d", "e", "f"), owner=owner, pipeline="lit")
    headers = _auth(make_key, owner)

    response = client.get(f"/v1/jobs/{second.id}/diff?limit=2", headers=headers)

    assert response.status_code == 200
    body = response.json()
    assert body["job_id"] == str(second.id)
    assert body["previous_job_id"] == str(first.id)
    assert body["kind"] == "new"
    assert body["counts"] == {"new": 3, "removed": 1, "unchanged": 2}
    assert body["items"] == [{"id": "d"}, {"id": "e"}]
    rest = client.get(
        f"/v1/jobs/{second.id}/diff",
        params={"limit": 2, "cursor": body["next_cursor"]},
        headers=headers,
    ).json()
    assert rest["items"] == [{"id": "f"}] and rest["next_cursor"] is None
    removed = client.get(f"/v1/jobs/{second.id}/diff?kind=removed", headers=headers).json()
    assert removed["items"] == [{"id": "a"}]
    unchanged = client.get(f"/v1/jobs/{second.id}/diff?kind=unchanged", headers=headers).json()
    assert unchanged["items"] == [{"id": "b"}, {"id": "c"}]


def test_a_first_run_is_all_new(client: TestClient, runtime: Runtime, make_key: KeyFactory) -> None:
    owner = f"diff-{uuid.uuid4().hex[:8]}"
    job = run_items(runtime, _items("a", "b"), owner=owner, pipeline="fresh")

    body = client.get(f"/v1/jobs/{job.id}/diff", headers=_auth(make_key, owner)).json()

    assert body["previous_job_id"] is None
    assert body["counts"] == {"new": 2, "removed": 0, "unchanged": 0}


def test_a_job_without_result_items_is_a_conflict(
    client: TestClient, make_key: KeyFactory, writer: dict[str, str]
) -> None:
    job = client.post("/v1/jobs", json={"pipeline": GREET, "params": {"who": "x"}}, headers=writer)
    job_id = job.json()["job"]["id"]

    response = client.get(f"/v1/jobs/{job_id}/diff", headers=writer)

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "no_result_items"


def test_another_owners_job_and_bad_queries_are_refused(
    client: TestClient, runtime: Runtime, make_key: KeyFactory
) -> None:
    owner = f"diff-{uuid.uuid4().hex[:8]}"
    job = run_items(runtime, _items("a"), owner=owner, pipeline="private")
    mine = _auth(make_key, owner)
    checks: list[tuple[str, dict[str, str], int, str]] = [
        (f"/v1/jobs/{job.id}/diff", _auth(make_key, "someone-else"), 404, "job_not_found"),
        ("/v1/jobs/not-a-uuid/diff", mine, 404, "job_not_found"),
        (f"/v1/jobs/{job.id}/diff?kind=changed", mine, 400, "invalid_query"),
        (f"/v1/jobs/{job.id}/diff?limit=0", mine, 400, "invalid_query"),
        (f"/v1/jobs/{job.id}/diff?cursor=%25%25", mine, 400, "invalid_cursor"),
    ]
    for url, headers, status, code in checks:
        response = client.get(url, headers=headers)
        assert (response.status_code, response.json()["error"]["code"]) == (status, code), url


def test_diff_mode_and_notify_url_are_accepted_and_the_url_is_checked(
    client: TestClient, writer: dict[str, str], job_count: Callable[[], int]
) -> None:
    body = {"pipeline": GREET, "params": {"who": "x"}, "diff_mode": True}
    accepted = client.post(
        "/v1/jobs", json={**body, "notify_url": "https://hooks.example.org/x"}, headers=writer
    )
    assert accepted.status_code == 202
    assert accepted.json()["job"]["diff_mode"] is True

    before = job_count()
    for url in ("ftp://example.org/x", "https://user:pw@example.org/x", "https:///nohost"):
        refused = client.post("/v1/jobs", json={**body, "notify_url": url}, headers=writer)
        assert refused.status_code == 422, url
        assert refused.json()["error"]["code"] == "notify_url_invalid"
    assert job_count() == before
