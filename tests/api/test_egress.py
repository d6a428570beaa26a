"""A notice or escalation URL the egress policy would refuse is refused when it is saved, storing
nothing.

Only what the URL alone tells is judged then (scheme, credentials, allow-lists, an address
spelled in the URL); a host name's addresses are checked again at every delivery.
"""

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.engine.runtime import Runtime
from service.platform.settings import Settings
from tests.support.apps import api_client

Headers = dict[str, str]
HOOKS = "hooks.example.org"


@pytest.fixture(scope="module")
def closed(settings: Settings, runtime: Runtime) -> Iterator[TestClient]:
    """A deployment with the defaults: https only, no internal host opened."""
    update = {"egress_allow_http": False, "egress_internal_hosts": []}
    with api_client(settings.model_copy(update=update), runtime) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def listed(settings: Settings, runtime: Runtime) -> Iterator[TestClient]:
    """The same, sending notices only to its hook host."""
    update = {
        "egress_allow_http": False,
        "egress_internal_hosts": [],
        "egress_action_allowed_hosts": {"notice": [HOOKS]},
    }
    with api_client(settings.model_copy(update=update), runtime) as test_client:
        yield test_client


REFUSED = [
    ("closed", "https://169.254.169.254/latest/meta-data/", "egress_address_refused"),
    ("closed", "https://10.0.0.5/hook", "egress_address_refused"),
    ("closed", "https://[::1]/hook", "egress_address_refused"),
    ("closed", "https://[::ffff:192.168.0.1]/hook", "egress_address_refused"),
    ("closed", "https://2130706433/hook", "egress_address_refused"),
    ("closed", "https://0x7f.1/hook", "egress_address_refused"),
    ("closed", f"http://{HOOKS}/hook", "egress_scheme_refused"),
    ("closed", f"https://user:pw@{HOOKS}/hook", "notify_url_invalid"),
    ("closed", f"ftp://{HOOKS}/hook", "notify_url_invalid"),
    ("listed", "https://elsewhere.example.org/hook", "egress_host_not_allowed"),
]


def _submit(client: TestClient, headers: Headers, url: str) -> Any:
    body = {"pipeline": "greet", "params": {"who": "ada"}, "notify_url": url}
    return client.post("/v1/jobs", json=body, headers=headers)


def _schedule(client: TestClient, headers: Headers, url: str) -> Any:
    body = {"every": "1d", "params": {"who": "ada"}, "notify_url": url}
    return client.put("/v1/pipelines/greet/schedule", json=body, headers=headers)


@pytest.mark.parametrize(("deployment", "url", "code"), REFUSED)
def test_a_job_whose_notify_url_is_refused_is_not_stored(
    request: pytest.FixtureRequest,
    writer: Headers,
    job_count: Callable[[], int],
    deployment: str,
    url: str,
    code: str,
) -> None:
    client: TestClient = request.getfixturevalue(deployment)
    before = job_count()
    response = _submit(client, writer, url)

    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == code
    assert job_count() == before


@pytest.mark.parametrize(
    ("deployment", "url", "code"), [case for case in REFUSED if case[2].startswith("egress_")]
)
def test_a_schedule_whose_notify_url_is_refused_is_not_stored(
    request: pytest.FixtureRequest, writer: Headers, deployment: str, url: str, code: str
) -> None:
    client: TestClient = request.getfixturevalue(deployment)
    response = _schedule(client, writer, url)

    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == code
    assert client.get("/v1/pipelines/greet/schedule", headers=writer).status_code == 404


def test_a_schedule_notifying_the_allowed_host_is_saved(
    listed: TestClient, writer: Headers
) -> None:
    saved = _schedule(listed, writer, f"https://{HOOKS}/hook")
    assert saved.status_code == 200, saved.text
    assert listed.delete("/v1/pipelines/greet/schedule", headers=writer).status_code == 204


def _escalating(name: str, url: str) -> str:
    return f"""\
name: {name}
steps:
  - id: ship
    action: noop
    approval: {{on_timeout: escalate, escalate_to: "{url}"}}
"""


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("https://169.254.169.254/latest/meta-data/", "egress_address_refused"),
        ("https://[::ffff:127.0.0.1]/hook", "egress_address_refused"),
        (f"http://{HOOKS}/hook", "egress_scheme_refused"),
    ],
)
def test_a_pipeline_whose_escalation_url_is_refused_is_not_saved_or_run_inline(
    closed: TestClient, writer: Headers, job_count: Callable[[], int], url: str, code: str
) -> None:
    profile = _escalating("escalating", url)
    before = job_count()
    saved = closed.put(
        "/v1/pipelines/escalating",
        content=profile,
        headers={**writer, "Content-Type": "application/yaml"},
    )
    inline = closed.post("/v1/jobs", json={"pipeline": profile}, headers=writer)

    for response in (saved, inline):
        assert response.status_code == 422, response.text
        assert response.json()["error"]["code"] == code
        assert response.json()["error"]["details"]["step_id"] == "ship"
    assert closed.get("/v1/pipelines/escalating", headers=writer).status_code == 404
    assert job_count() == before


def test_a_pipeline_escalating_to_a_public_host_is_saved(
    closed: TestClient, writer: Headers
) -> None:
    profile = _escalating(f"escalates-{uuid.uuid4().hex[:6]}", f"https://{HOOKS}/hook")
    name = profile.split("\n")[0].removeprefix("name: ")
    saved = closed.put(
        f"/v1/pipelines/{name}",
        content=profile,
        headers={**writer, "Content-Type": "application/yaml"},
    )
    assert saved.status_code == 201, saved.text
