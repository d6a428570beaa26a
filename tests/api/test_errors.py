import pytest
from fastapi.testclient import TestClient
from kombu.exceptions import OperationalError as KombuOperationalError
from sqlalchemy.exc import OperationalError

from api.app import create_app
from api.errors import STATUS_BY_CODE
from service.engine.runtime import Runtime
from service.platform import errors
from service.platform.settings import Settings
from tests.api.conftest import KeyFactory


@pytest.mark.parametrize(
    ("exc", "status", "code"),
    [
        (RuntimeError("boom"), 500, "internal_error"),
        (OperationalError("SELECT 1", {}, Exception("down")), 503, "database_unavailable"),
        (KombuOperationalError("down"), 503, "broker_unavailable"),
        (errors.JobConflict("busy"), 409, "job_conflict"),
    ],
)
def test_errors_leave_in_the_envelope(
    settings: Settings, runtime: Runtime, exc: Exception, status: int, code: str
) -> None:
    app = create_app(settings, runtime=runtime, celery_app=object())

    def fail() -> None:
        raise exc

    app.add_api_route("/boom", fail)
    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.get("/boom")
    assert response.status_code == status
    assert response.json()["error"]["code"] == code
    if status == 500:
        assert response.json()["error"]["message"] == "internal server error"


def _descendants(cls: type[errors.FlowbeatError]) -> set[type[errors.FlowbeatError]]:
    return {cls}.union(*(_descendants(sub) for sub in cls.__subclasses__()))


def test_every_domain_code_has_a_status() -> None:
    """Every error the service can raise, wherever its class is defined: the API has imported
    every module that raises one."""
    codes = {cls.code for cls in _descendants(errors.FlowbeatError)}
    command_only = {
        "action_module_unimportable",
        "embedded_unavailable",
        "flower_auth_required",
        "job_id_ambiguous",
        "job_id_invalid",
        "key_not_found",
        "mcp_key_required",
        "metrics_token_required",
        "payload_invalid",
        "settings_incomplete",
    }
    step_only = {"action_failed", "cancelled", "data_file_missing"}
    api_facing = codes - step_only - command_only
    assert api_facing <= set(STATUS_BY_CODE)


def test_a_body_sent_without_a_json_content_type_is_refused_saying_so(
    client: TestClient, writer: dict[str, str]
) -> None:
    form = {**writer, "Content-Type": "application/x-www-form-urlencoded"}
    response = client.post("/v1/jobs", content=b'{"pipeline": "greet"}', headers=form)

    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "validation_error"
    assert "Content-Type: application/json" in error["message"]
    assert "application/x-www-form-urlencoded" in error["message"]


def test_a_nul_character_in_a_parameter_is_an_invalid_parameter_not_a_500(
    client: TestClient, make_key: KeyFactory
) -> None:
    """Found by the fuzzer: PostgreSQL refuses NUL in text, so no query is sent with one."""
    reader = {"Authorization": f"Bearer {make_key('read')}"}

    for url in ("/v1/pipelines?tag=%00", "/v1/pipelines/gr%00eet", "/v1/jobs/%00"):
        answer = client.get(url, headers=reader)

        assert answer.status_code == 400, url
        assert answer.json()["error"]["code"] == "invalid_query"
