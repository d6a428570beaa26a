import pytest
from fastapi.testclient import TestClient

from service.engine.runtime import Runtime
from service.platform.auth import authenticate, create_api_key, revoke_api_key
from service.platform.db import unit_of_work
from service.platform.errors import Forbidden, Unauthorized
from tests.api.conftest import KeyFactory


def test_key_round_trip_scopes_and_revocation(runtime: Runtime) -> None:
    with unit_of_work(runtime.sessions) as session:
        token, row = create_api_key(session, owner="carol", scopes=["write"])
    assert token.startswith("fb_") and row.secret_hash not in token
    with runtime.sessions() as session:
        principal = authenticate(session, token)
    assert principal.owner == "carol" and principal.key_id == row.id
    principal.require("read")
    principal.require("write")
    with pytest.raises(Forbidden):
        principal.require("admin")
    with unit_of_work(runtime.sessions) as session:
        assert revoke_api_key(session, row.prefix)
    with runtime.sessions() as session, pytest.raises(Unauthorized):
        authenticate(session, token)


@pytest.mark.parametrize("scopes", [[], ["root"], ["read", "sudo"]])
def test_create_refuses_unknown_scopes(runtime: Runtime, scopes: list[str]) -> None:
    with runtime.sessions() as session, pytest.raises(ValueError):
        create_api_key(session, owner="x", scopes=scopes)


def test_every_bad_token_reads_the_same(runtime: Runtime, make_key: KeyFactory) -> None:
    token = make_key("read")
    prefix = token[3:11]
    bad = ["", "nope", "fb_short_x", f"fb_{prefix}_wrong", f"fb_zzzzzzzz_{token[12:]}", token + "x"]
    messages = set()
    for candidate in bad:
        with runtime.sessions() as session, pytest.raises(Unauthorized) as caught:
            authenticate(session, candidate)
        messages.add(caught.value.message)
    assert len(messages) == 1


def test_missing_or_bad_key_is_401(client: TestClient) -> None:
    for headers in ({}, {"Authorization": "Bearer fb_abcdefgh_nope"}, {"Authorization": "Basic x"}):
        response = client.get("/v1/jobs", headers=headers)
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.json()["error"]["code"] == "unauthorized"


def test_read_key_cannot_submit(client: TestClient, make_key: KeyFactory) -> None:
    headers = {"Authorization": f"Bearer {make_key('read')}"}
    response = client.post("/v1/jobs", json={"pipeline": "greet"}, headers=headers)
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "forbidden"


def test_other_owner_sees_404_admin_sees_job(client: TestClient, make_key: KeyFactory) -> None:
    mine = {"Authorization": f"Bearer {make_key('write')}"}
    job = client.post("/v1/jobs", json={"pipeline": "greet", "params": {"who": "a"}}, headers=mine)
    job_id = job.json()["job"]["id"]
    other = {"Authorization": f"Bearer {make_key('admin', owner='someone-else')}"}
    stranger = {"Authorization": f"Bearer {make_key('read')}"}
    assert client.get(f"/v1/jobs/{job_id}", headers=stranger).status_code == 404
    assert client.get(f"/v1/jobs/{job_id}", headers=other).status_code == 200
