"""GET /v1/pipelines/{name}/runs: a pipeline's runs, newest first, with their item counts."""

import uuid

from fastapi.testclient import TestClient

from service.engine.runtime import Runtime
from tests.api.conftest import KeyFactory
from tests.support.runs import run_items


def test_runs_are_listed_newest_first_with_counts(
    client: TestClient, runtime: Runtime, make_key: KeyFactory
) -> None:
    owner = f"runs-{uuid.uuid4().hex[:8]}"
    headers = {"Authorization": f"Bearer {make_key('read', owner=owner)}"}
    first = run_items(runtime, [{"id": "a"}], owner=owner, pipeline="weekly", diff_mode=True)
    broken = run_items(runtime, [{"nokey": 1}], owner=owner, pipeline="weekly")
    third = run_items(
        runtime, [{"id": "a"}, {"id": "b"}], owner=owner, pipeline="weekly", diff_mode=True
    )
    fourth = run_items(runtime, [{"id": "b"}], owner=owner, pipeline="weekly", diff_mode=True)
    run_items(runtime, [{"id": "z"}], owner=owner, pipeline="other")

    body = client.get("/v1/pipelines/weekly/runs", headers=headers).json()

    runs = body["runs"]
    assert [run["job_id"] for run in runs] == [
        str(fourth.id),
        str(third.id),
        str(broken.id),
        str(first.id),
    ]
    assert [run["status"] for run in runs] == ["succeeded", "succeeded", "failed", "succeeded"]
    assert [(r["item_count"], r["new_count"], r["removed_count"]) for r in runs] == [
        (1, 0, 1),
        (2, 1, 0),
        (None, None, None),
        (1, 1, 0),
    ]
    assert [run["no_new_items"] for run in runs] == [True, False, False, False]
    assert all(run["trigger"] == "api" and run["finished_at"] for run in runs)


def test_runs_page_with_a_cursor(
    client: TestClient, runtime: Runtime, make_key: KeyFactory
) -> None:
    owner = f"runs-{uuid.uuid4().hex[:8]}"
    headers = {"Authorization": f"Bearer {make_key('read', owner=owner)}"}
    jobs = [run_items(runtime, [{"id": str(n)}], owner=owner, pipeline="paged") for n in range(5)]

    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = client.get("/v1/pipelines/paged/runs", params=params, headers=headers).json()
        seen += [run["job_id"] for run in page["runs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [str(job.id) for job in reversed(jobs)]


def test_only_the_callers_runs_are_listed_and_names_are_checked(
    client: TestClient, runtime: Runtime, make_key: KeyFactory
) -> None:
    owner = f"runs-{uuid.uuid4().hex[:8]}"
    run_items(runtime, [{"id": "a"}], owner=owner, pipeline="secret")
    stranger = {"Authorization": f"Bearer {make_key('read')}"}

    assert client.get("/v1/pipelines/secret/runs", headers=stranger).json()["runs"] == []
    bad = client.get("/v1/pipelines/Not_A_Name/runs", headers=stranger)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_query"
    assert client.get("/v1/pipelines/secret/runs").status_code == 401
