"""The pipelines API: YAML or JSON saves with versions, visibility, sharing, runs and imports."""

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from service.engine.runtime import Runtime
from service.platform.models import PipelineRow
from service.platform.settings import Settings
from tests.api.conftest import KeyFactory
from tests.support.apps import api_client

Headers = dict[str, str]
YAML_TYPE = "application/yaml"
STEPS = "steps: [{{id: a, action: noop}}]"


def profile_text(name: str, *, tag: str = "lit", steps: int = 1) -> str:
    lines = [f"name: {name}", f"tags: [{tag}]", "description: a search", "steps:"]
    lines.append("  - {id: s1, action: noop}")
    for i in range(2, steps + 1):
        lines.append(f"  - {{id: s{i}, action: noop, depends_on: [s{i - 1}]}}")
    return "\n".join(lines) + "\n"


def unique_name() -> str:
    return f"p-{uuid.uuid4().hex[:10]}"


def _error(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == code and error["message"] and isinstance(error["details"], dict)
    return error


@pytest.fixture
def owner_key(make_key: KeyFactory) -> Callable[..., Headers]:
    def make(owner: str | None = None, *scopes: str) -> Headers:
        token = make_key(*(scopes or ("write",)), owner=owner or f"o-{uuid.uuid4().hex[:8]}")
        return {"Authorization": f"Bearer {token}"}

    return make


@pytest.fixture
def pipelines_count(runtime: Runtime) -> Callable[[], int]:
    def count() -> int:
        with runtime.sessions() as session:
            return session.scalar(select(func.count()).select_from(PipelineRow)) or 0

    return count


def put(client: TestClient, headers: Headers, name: str, body: str, **kw: Any) -> Any:
    content_type = kw.pop("content_type", "application/yaml")
    return client.put(
        f"/v1/pipelines/{name}",
        content=body.encode(),
        headers={**headers, "Content-Type": content_type},
        **kw,
    )


def test_put_yaml_then_json_of_the_same_profile_keeps_one_version(
    client: TestClient, writer: Headers
) -> None:
    name = unique_name()
    first = put(client, writer, name, profile_text(name))
    document: dict[str, object] = {"name": name, "tags": ["lit"], "description": "a search"}
    document["steps"] = [{"id": "s1", "action": "noop"}]
    same = put(client, writer, name, json.dumps(document), content_type="application/json")
    changed = put(client, writer, name, profile_text(name, steps=2), content_type="text/yaml")

    assert first.status_code == 201, first.text
    created = first.json()["pipeline"]
    assert (created["version"], created["read_only"], created["tags"]) == (1, False, ["lit"])
    assert len(created["content_hash"]) == 64 and created["profile"]["name"] == name
    assert same.status_code == 200 and same.json()["created_version"] is False
    assert same.json()["pipeline"]["content_hash"] == created["content_hash"]
    assert changed.status_code == 201 and changed.json()["pipeline"]["version"] == 2

    versions = client.get(f"/v1/pipelines/{name}/versions", headers=writer).json()["versions"]
    assert [(v["version"], v["current"]) for v in versions] == [(2, True), (1, False)]
    old = client.get(f"/v1/pipelines/{name}", params={"version": 1}, headers=writer)
    assert len(old.json()["pipeline"]["profile"]["steps"]) == 1


def test_a_pipeline_is_read_with_the_text_it_was_saved_from(
    client: TestClient, writer: Headers
) -> None:
    name = unique_name()
    text = "# kept as written\n" + profile_text(name)
    saved = put(client, writer, name, text)
    recommented = put(client, writer, name, "# only a comment changed\n" + profile_text(name))
    read = client.get(f"/v1/pipelines/{name}", headers=writer)
    shipped = client.get("/v1/pipelines/greet", headers=writer)

    assert saved.status_code == 201 and saved.json()["pipeline"]["source"] == text
    assert recommented.status_code == 200, recommented.text
    assert recommented.json()["pipeline"]["source"] == text
    assert read.status_code == 200 and read.json()["pipeline"]["source"] == text
    assert read.json()["pipeline"]["profile"]["name"] == name
    assert shipped.status_code == 200 and shipped.json()["pipeline"]["source"] is None


@pytest.mark.parametrize(
    ("body", "content_type", "status", "code"),
    [
        (f"name: other\n{STEPS}", "application/yaml", 422, "pipeline_name_mismatch"),
        ("name: {name}\nsteps: [{{id: a, action: nope}}]", YAML_TYPE, 422, "profile_invalid"),
        ("name: {name}\nsteps: [", "application/yaml", 422, "profile_invalid"),
        ("name: {name}\n" + STEPS, "text/html", 415, "unsupported_media_type"),
        ("name: {name}\n" + STEPS, "", 415, "unsupported_media_type"),
        ("x" * 30_000, "application/yaml", 413, "payload_too_large"),
        ("name: {name}\nx: " + "[" * 3000 + "]" * 3000, YAML_TYPE, 422, "profile_invalid"),
    ],
)
def test_refused_saves_store_nothing(
    client: TestClient,
    writer: Headers,
    pipelines_count: Callable[[], int],
    body: str,
    content_type: str,
    status: int,
    code: str,
) -> None:
    name = unique_name()
    before = pipelines_count()
    response = put(client, writer, name, body.format(name=name), content_type=content_type)
    _error(response, status, code)
    assert pipelines_count() == before


def test_an_invalid_name_in_the_url_is_refused(client: TestClient, writer: Headers) -> None:
    _error(put(client, writer, "Bad_Name", "name: x\n"), 422, "profile_invalid")
    _error(client.get("/v1/pipelines/Bad_Name", headers=writer), 422, "profile_invalid")


def test_scopes(client: TestClient, owner_key: Callable[..., Headers]) -> None:
    reader = owner_key(None, "read")
    name = unique_name()
    _error(put(client, reader, name, profile_text(name)), 403, "forbidden")
    _error(client.delete(f"/v1/pipelines/{name}", headers=reader), 403, "forbidden")
    assert client.get("/v1/pipelines", headers=reader).status_code == 200
    _error(client.get("/v1/pipelines"), 401, "unauthorized")


def test_shipped_profiles_are_listed_readable_runnable_and_read_only(
    client: TestClient, writer: Headers
) -> None:
    listed = client.get("/v1/pipelines", headers=writer).json()["pipelines"]
    greet = next(p for p in listed if p["name"] == "greet")
    assert (greet["owner"], greet["read_only"], greet["version"]) == ("system", True, None)

    assert client.get("/v1/pipelines/greet", headers=writer).status_code == 200
    _error(put(client, writer, "greet", "name: greet\nsteps: [{id: a, action: noop}]"), 409,
           "pipeline_read_only")  # fmt: skip
    _error(client.delete("/v1/pipelines/greet", headers=writer), 409, "pipeline_read_only")
    body = {"pipeline": "greet", "params": {"who": "x"}}
    job = client.post("/v1/jobs", json=body, headers=writer)
    assert job.status_code == 202
    again = client.get("/v1/pipelines/greet", headers=writer).json()["pipeline"]
    assert again["run_count"] == 1


def test_an_api_started_where_there_is_no_profiles_folder_serves_the_shipped_profiles(
    settings: Settings,
    runtime: Runtime,
    writer: Headers,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    shipped_only = settings.model_copy(update={"profiles_dir": None})
    with api_client(shipped_only, runtime) as client:
        listed = client.get("/v1/pipelines", headers=writer)
        digest = client.get("/v1/pipelines/papers-digest", headers=writer)
        save = put(
            client, writer, "papers-digest", "name: papers-digest\nsteps: [{id: a, action: noop}]"
        )

    assert listed.status_code == 200, listed.text
    names = {p["name"] for p in listed.json()["pipelines"]}
    assert {"papers-digest", "review-loop"} <= names and "greet" not in names
    assert digest.json()["pipeline"]["owner"] == "system"
    _error(save, 409, "pipeline_read_only")


def test_sharing_lets_another_owner_read_and_run_but_not_change(
    client: TestClient, owner_key: Callable[..., Headers]
) -> None:
    alice_name, bob_name = f"a-{uuid.uuid4().hex[:8]}", f"b-{uuid.uuid4().hex[:8]}"
    alice, bob = owner_key(alice_name), owner_key(bob_name)
    carol = owner_key()
    name = unique_name()
    tag = f"t{uuid.uuid4().hex[:6]}"
    put(client, alice, name, profile_text(name, tag=tag))

    _error(client.get(f"/v1/pipelines/{name}", headers=bob), 404, "pipeline_not_found")
    _error(client.put(f"/v1/pipelines/{name}/shares/x", headers=bob), 404, "pipeline_not_found")
    shared = client.put(f"/v1/pipelines/{name}/shares/{bob_name}", headers=alice)
    assert shared.json() == {"name": name, "shared_with": [bob_name]}

    seen = client.get(f"/v1/pipelines/{name}", headers=bob).json()["pipeline"]
    assert (seen["owner"], seen["read_only"], seen["shared_with"]) == (alice_name, True, [])
    listed = client.get("/v1/pipelines", params={"tag": tag}, headers=bob).json()["pipelines"]
    assert [p["name"] for p in listed] == [name]
    assert client.get("/v1/pipelines", params={"tag": tag}, headers=carol).json() == {
        "pipelines": []
    }
    run = client.post("/v1/jobs", json={"pipeline": name}, headers=bob)
    assert run.status_code == 202, run.text
    _error(client.delete(f"/v1/pipelines/{name}", headers=bob), 409, "pipeline_read_only")
    _error(client.put(f"/v1/pipelines/{name}/shares/{bob_name}", headers=bob), 409,
           "pipeline_read_only")  # fmt: skip

    owners_view = client.get(f"/v1/pipelines/{name}", headers=alice).json()["pipeline"]
    assert owners_view["run_count"] == 1 and owners_view["shared_with"] == [bob_name]
    unshared = client.delete(f"/v1/pipelines/{name}/shares/{bob_name}", headers=alice)
    assert unshared.json()["shared_with"] == []
    _error(client.post("/v1/jobs", json={"pipeline": name}, headers=bob), 404,
           "pipeline_not_found")  # fmt: skip


def _shared_with_bob(
    client: TestClient, owner_key: Callable[..., Headers]
) -> tuple[Headers, Headers, str, str, str]:
    """A pipeline Alice saved and shared with Bob: their keys, their names, the pipeline's."""
    alice_name, bob_name = f"a-{uuid.uuid4().hex[:8]}", f"b-{uuid.uuid4().hex[:8]}"
    alice, bob = owner_key(alice_name), owner_key(bob_name)
    name = unique_name()
    put(client, alice, name, profile_text(name))
    client.put(f"/v1/pipelines/{name}/shares/{bob_name}", headers=alice)
    return alice, bob, alice_name, bob_name, name


def test_a_grantee_saving_a_shared_name_gets_a_pipeline_of_their_own(
    client: TestClient, owner_key: Callable[..., Headers]
) -> None:
    alice, bob, alice_name, bob_name, name = _shared_with_bob(client, owner_key)

    saved = put(client, bob, name, profile_text(name, steps=2))

    assert saved.status_code == 201, saved.text
    assert saved.json()["pipeline"]["owner"] == bob_name
    hers = client.get(f"/v1/pipelines/{name}", headers=alice).json()["pipeline"]
    assert (hers["owner"], hers["version"]) == (alice_name, 1)
    own_run = client.post("/v1/jobs", json={"pipeline": name}, headers=bob).json()["job"]
    assert [s["step_id"] for s in own_run["steps"]] == ["s1", "s2"]
    named = {"pipeline": f"{alice_name}/{name}"}
    her_run = client.post("/v1/jobs", json=named, headers=bob).json()["job"]
    assert [s["step_id"] for s in her_run["steps"]] == ["s1"]


def test_purging_history_keeps_the_runs_of_those_it_was_shared_with(
    client: TestClient, owner_key: Callable[..., Headers]
) -> None:
    alice, bob, _, _, name = _shared_with_bob(client, owner_key)
    client.post("/v1/jobs", json={"pipeline": name}, headers=alice)
    bobs = client.post("/v1/jobs", json={"pipeline": name}, headers=bob).json()["job"]

    purged = client.delete(f"/v1/pipelines/{name}", params={"purge_history": "true"}, headers=alice)

    assert purged.json() == {"name": name, "purged_jobs": 1}
    assert client.get(f"/v1/jobs/{bobs['id']}", headers=bob).status_code == 200


def test_admins_see_and_manage_every_owners_pipelines(
    client: TestClient, owner_key: Callable[..., Headers]
) -> None:
    alice_name = f"a-{uuid.uuid4().hex[:8]}"
    alice, admin = owner_key(alice_name), owner_key(None, "admin")
    name = unique_name()
    put(client, alice, name, profile_text(name))

    assert client.get(f"/v1/pipelines/{name}", headers=admin).status_code == 200
    deleted = client.delete(f"/v1/pipelines/{name}", params={"owner": alice_name}, headers=admin)
    assert deleted.status_code == 200, deleted.text
    _error(client.get(f"/v1/pipelines/{name}", headers=alice), 404, "pipeline_not_found")


def test_a_job_records_the_version_it_ran(
    client: TestClient, writer: Headers, runtime: Runtime
) -> None:
    from service.platform.models import JobRow

    name = unique_name()
    put(client, writer, name, profile_text(name))
    put(client, writer, name, profile_text(name, steps=3))
    job = client.post("/v1/jobs", json={"pipeline": name}, headers=writer).json()["job"]

    assert [s["step_id"] for s in job["steps"]] == ["s1", "s2", "s3"]
    with runtime.sessions() as session:
        row = session.get(JobRow, uuid.UUID(job["id"]))
        assert row is not None and row.pipeline_version == 2


def _run(client: TestClient, headers: Headers, name: str, runtime: Runtime) -> tuple[int, Any]:
    """Steps and (pipeline, version) of a job of ``name``, as stored."""
    from service.platform.models import JobRow

    response = client.post("/v1/jobs", json={"pipeline": name}, headers=headers)
    assert response.status_code == 202, response.text
    job = response.json()["job"]
    with runtime.sessions() as session:
        row = session.get(JobRow, uuid.UUID(job["id"]))
        assert row is not None
        return len(job["steps"]), (row.pipeline_id, row.pipeline_version)


def test_a_new_version_is_run_by_the_next_job_however_often_the_old_one_ran(
    client: TestClient, writer: Headers, runtime: Runtime
) -> None:
    """The API remembers what a name resolved to and checks it in the statement that stores
    the job: a version saved since is never missed."""
    name = unique_name()
    put(client, writer, name, profile_text(name))
    runs = [_run(client, writer, name, runtime) for _ in range(3)]
    put(client, writer, name, profile_text(name, steps=3))
    after = [_run(client, writer, name, runtime) for _ in range(2)]

    [(pipeline_id, _)] = {ran for _, ran in runs}
    assert [steps for steps, _ in runs] == [1, 1, 1]
    assert after == [(3, (pipeline_id, 2))] * 2


def test_an_own_pipeline_saved_after_a_shared_one_ran_is_run_instead(
    client: TestClient, owner_key: Callable[..., Headers], runtime: Runtime
) -> None:
    _, bob, _, _, name = _shared_with_bob(client, owner_key)
    shared = [_run(client, bob, name, runtime) for _ in range(2)]
    put(client, bob, name, profile_text(name, steps=2))
    own = [_run(client, bob, name, runtime) for _ in range(2)]

    assert [steps for steps, _ in shared] == [1, 1] and [steps for steps, _ in own] == [2, 2]
    assert len({ran for _, ran in shared + own}) == 2


def test_delete_keeps_runs_unless_history_is_purged(client: TestClient, writer: Headers) -> None:
    kept, purged = unique_name(), unique_name()
    for name in (kept, purged):
        put(client, writer, name, profile_text(name))
        assert client.post("/v1/jobs", json={"pipeline": name}, headers=writer).status_code == 202

    gone = client.delete(f"/v1/pipelines/{kept}", headers=writer)
    assert gone.json() == {"name": kept, "purged_jobs": 0}
    purge = client.delete(
        f"/v1/pipelines/{purged}", params={"purge_history": "true"}, headers=writer
    )
    assert purge.json() == {"name": purged, "purged_jobs": 1}

    jobs = client.get("/v1/jobs", params={"pipeline": kept}, headers=writer).json()["jobs"]
    assert len(jobs) == 1
    assert client.get("/v1/jobs", params={"pipeline": purged}, headers=writer).json()["jobs"] == []
    _error(client.get(f"/v1/pipelines/{kept}", headers=writer), 404, "pipeline_not_found")


@pytest.fixture
def import_dir(tmp_path: Path) -> Path:
    root = tmp_path / "imports"
    root.mkdir()
    (tmp_path / "outside.yaml").write_text("name: outside\nsteps: [{id: a, action: noop}]\n")
    (root / "link.yaml").symlink_to(tmp_path / "outside.yaml")
    return root


@pytest.fixture
def import_client(settings: Settings, runtime: Runtime, import_dir: Path) -> Iterator[TestClient]:
    configured = settings.model_copy(
        update={"import_dir": import_dir, "import_allowed_hosts": ["pipelines.test"]}
    )
    with api_client(configured, runtime) as test_client:
        yield test_client


def test_import_from_a_file_saves_it_like_a_put(
    import_client: TestClient, writer: Headers, import_dir: Path
) -> None:
    name = unique_name()
    (import_dir / "mine.yaml").write_text(profile_text(name))
    first = import_client.post("/v1/pipelines/import", json={"path": "mine.yaml"}, headers=writer)
    again = import_client.post(
        "/v1/pipelines/import", json={"path": "mine.yaml", "name": name}, headers=writer
    )

    assert first.status_code == 201, first.text
    assert first.json()["pipeline"]["name"] == name
    assert again.status_code == 200 and again.json()["created_version"] is False


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"path": "../outside.yaml"}, 403, "import_path_refused"),
        ({"path": "link.yaml"}, 403, "import_path_refused"),
        ({"path": "/etc/hostname"}, 403, "import_path_refused"),
        ({"path": "missing.yaml"}, 404, "import_not_found"),
        ({"url": "http://pipelines.test/p.yaml"}, 422, "import_scheme_refused"),
        ({"url": "https://elsewhere.test/p.yaml"}, 403, "import_host_not_allowed"),
        ({"url": "https://x.test/a", "path": "a.yaml"}, 422, "import_request_invalid"),
        ({}, 422, "import_request_invalid"),
    ],
)
def test_refused_imports_store_nothing(
    import_client: TestClient,
    writer: Headers,
    pipelines_count: Callable[[], int],
    body: dict[str, str],
    status: int,
    code: str,
) -> None:
    before = pipelines_count()
    response = import_client.post("/v1/pipelines/import", json=body, headers=writer)
    _error(response, status, code)
    assert pipelines_count() == before


def test_imports_are_disabled_by_default(client: TestClient, writer: Headers) -> None:
    url = client.post("/v1/pipelines/import", json={"url": "https://a.test/p"}, headers=writer)
    path = client.post("/v1/pipelines/import", json={"path": "p.yaml"}, headers=writer)
    _error(url, 403, "imports_disabled")
    _error(path, 403, "imports_disabled")


def test_a_save_that_would_close_a_trigger_cycle_is_422_and_stores_nothing(
    client: TestClient, writer: Headers, pipelines_count: Callable[[], int]
) -> None:
    first, second = unique_name(), unique_name()
    trigger = "name: {name}\non: {{succeeded: [{up}]}}\n" + STEPS
    saved = put(client, writer, first, trigger.format(name=first, up=second))
    assert saved.status_code in (200, 201), saved.text
    before = pipelines_count()

    closing = put(client, writer, second, trigger.format(name=second, up=first))

    error = _error(closing, 422, "trigger_cycle")
    assert error["details"]["cycle"] == [second, first, second]
    assert pipelines_count() == before
