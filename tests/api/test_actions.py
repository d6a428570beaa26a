"""The action catalogue: every action a step may name, as a person or an LLM client writing a
profile reads it, and a save that names an unknown one refused with the closest names."""

from typing import Any

from fastapi.testclient import TestClient

from tests.api.conftest import KeyFactory

Headers = dict[str, str]


def _bearer(key: str) -> Headers:
    return {"Authorization": f"Bearer {key}"}


def _listed(client: TestClient, key: str) -> dict[str, Any]:
    answer = client.get("/v1/actions", headers=_bearer(key))
    assert answer.status_code == 200, answer.text
    return {action["name"]: action for action in answer.json()["actions"]}


def test_a_read_key_lists_builtin_module_and_engine_actions_by_name(
    client: TestClient, make_key: KeyFactory
) -> None:
    answer = client.get("/v1/actions", headers=_bearer(make_key("read")))

    names = [action["name"] for action in answer.json()["actions"]]
    assert names == sorted(names)
    listed = {action["name"]: action for action in answer.json()["actions"]}
    assert listed["noop"]["source"] == "builtin"
    assert listed["drill.count"]["source"] == "module"
    assert listed["drill.count"]["module"] == "tests.drill_actions"
    assert listed["wait"]["source"] == listed["pipeline.run"]["source"] == "engine"


def test_an_action_shows_its_docstring_its_inputs_and_its_flags(
    client: TestClient, make_key: KeyFactory
) -> None:
    sleep = _listed(client, make_key("read"))["sleep"]

    assert sleep["summary"].startswith("Stand in for slow work")
    assert sleep["input_schema"] == {
        "title": "sleep",
        "type": "object",
        "properties": {"seconds": {"type": "number"}, "result": {"default": None}},
        "required": ["seconds"],
        "additionalProperties": False,
    }
    assert sleep["cache"] is False and sleep["retry"] is True


def test_every_builtin_action_says_what_it_does(client: TestClient, make_key: KeyFactory) -> None:
    listed = _listed(client, make_key("read")).values()

    assert [a["name"] for a in listed if a["source"] != "module" and not a["summary"]] == []


def test_the_catalogue_needs_a_key(client: TestClient) -> None:
    answer = client.get("/v1/actions")

    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == "unauthorized"


def test_a_save_naming_an_unknown_action_is_refused_with_the_closest_names(
    client: TestClient, make_key: KeyFactory
) -> None:
    body = "name: typo\nsteps:\n  - {id: find, action: pubmed.serach}\n"
    answer = client.put(
        "/v1/pipelines/typo",
        content=body.encode(),
        headers={**_bearer(make_key("write")), "Content-Type": "application/yaml"},
    )

    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["code"] == "profile_invalid"
    assert "did you mean 'pubmed.search', 'pubmed.summary'?" in error["message"]
    [problem] = error["details"]["errors"]
    assert problem["code"] == "unknown_action"
    assert problem["closest"] == ["pubmed.search", "pubmed.summary"]
