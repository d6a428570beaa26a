"""Secrets: where a profile may name one, the sources an operator configures and their order,
and the mask that keeps a value out of what an attempt shows."""

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from service.language.checks import validate_profile
from service.language.expressions import ExprContext, parse_ref, resolve, reveal, secret_mark
from service.language.profiles import Profile
from service.language.secretrefs import secret_in_host
from service.language.snapshots import profile_secrets, step_facts
from service.platform.errors import ExpressionError, ProfileInvalid, SecretNotFound
from service.platform.masking import MASKED, Mask
from service.platform.secrets import (
    DirectorySource,
    EnvironmentSource,
    JsonSource,
    Secrets,
    SecretSourceInvalid,
    secrets_of,
)
from service.platform.settings import Settings

NONCE = "0123456789abcdef0123456789abcdef"


def profile(with_: dict[str, Any], **step: Any) -> dict[str, Any]:
    return {
        "name": "s",
        "params": {"base": {"type": "string"}},
        "steps": [{"id": "a", "action": "http.request", "with": with_, **step}],
    }


def codes(data: dict[str, Any]) -> list[str]:
    with pytest.raises(ProfileInvalid) as caught:
        validate_profile(data, source="t")
    return [error["code"] for error in caught.value.details["errors"]]


# Where a profile may name a secret


def test_a_secret_reference_names_one_secret_and_nothing_below_it() -> None:
    assert parse_ref("${{ secrets.API_TOKEN }}").name == "API_TOKEN"
    for bad in ("secrets", "secrets.A.b", "secrets.A__B", "secrets._A", "secrets.A-B"):
        with pytest.raises(ExpressionError):
            parse_ref("${{ " + bad + " }}")


@pytest.mark.parametrize(
    "url",
    [
        "https://api.example.com/v1?key=${{ secrets.K }}",
        "https://api.example.com/${{ secrets.K }}/items",
        "https://${{ params.base }}/x#${{ secrets.K }}",
        "${{ params.base }}://h?${{ secrets.K }}",
    ],
)
def test_a_secret_after_the_host_is_allowed(url: str) -> None:
    validate_profile(profile({"url": url}), source="t")


@pytest.mark.parametrize(
    "url",
    [
        "https://${{ secrets.K }}.example.com/",
        "https://api.example.com${{ secrets.K }}",
        "https://user:${{ secrets.K }}@api.example.com/",
        "${{ secrets.K }}",
        "${{ params.base }}/${{ secrets.K }}",
        "https://${{ params.base }}${{ secrets.K }}/",
        "${{ secrets.K }}://api.example.com/",
    ],
)
def test_a_secret_that_could_land_in_the_scheme_or_host_is_refused(url: str) -> None:
    assert "secret_in_url_host" in codes(profile({"url": url}))
    assert "secret_in_url_host" in codes(profile({"nested": [{"base_url": url}]}))


def test_a_secret_in_headers_and_other_inputs_is_allowed() -> None:
    checked = validate_profile(
        profile(
            {
                "url": "https://api.example.com/",
                "headers": {"Authorization": "Bearer ${{ secrets.TOKEN }}"},
                "body": "${{ secrets.BODY }}",
            }
        ),
        source="t",
    )
    assert profile_secrets(checked) == {"TOKEN", "BODY"}


def test_secrets_are_read_only_in_a_steps_own_with() -> None:
    undo = {"compensate": {"action": "noop", "with": {"x": "${{ secrets.K }}"}}}
    assert codes(profile({"url": "https://h/"}, **undo)) == ["bad_reference"]
    each = {"for_each": {"items": "${{ secrets.K }}"}}
    assert codes(profile({"url": "https://h/"}, **each)) == ["bad_reference"]
    when = {"when": "${{ secrets.K }} == 'x'"}
    assert codes(profile({"url": "https://h/"}, **when)) == ["condition_invalid"]
    wait = {"id": "w", "action": "wait", "with": {"until": "${{ secrets.K }}"}}
    assert "bad_reference" in codes({"name": "w", "steps": [wait]})


def test_a_step_that_names_no_secret_has_none_to_reveal() -> None:
    checked = Profile.model_validate(profile({"url": "${{ params.base }}"}))
    assert step_facts(checked, "a").secrets == frozenset()
    assert profile_secrets(checked) == frozenset()


# Marks: a secret resolves to a mark of the attempt's nonce, revealed only by the call


def test_only_the_attempts_own_marks_are_revealed() -> None:
    forged = secret_mark("f" * 32, "K")
    ctx = ExprContext(params={"p": forged}, outputs={}, secret=lambda n: secret_mark(NONCE, n))
    inputs = resolve({"h": "Bearer ${{ secrets.K }}", "p": "${{ params.p }}"}, ctx)
    assert "value" not in json.dumps(inputs)
    shown = reveal(inputs, NONCE, lambda name: "value")
    assert shown == {"h": "Bearer value", "p": forged}


def test_a_secret_outside_a_with_does_not_resolve() -> None:
    with pytest.raises(ExpressionError):
        resolve("${{ secrets.K }}", ExprContext(params={}, outputs={}))


# Sources and their order


def test_the_environment_holds_deployment_and_owner_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FLOWBEAT_SECRET_TOKEN", "deployment")
    monkeypatch.setenv("FLOWBEAT_SECRET_alice__TOKEN", "alices")
    source = Secrets([EnvironmentSource()])
    assert source.value("TOKEN", "alice") == "alices"
    assert source.value("TOKEN", "bob") == "deployment"
    assert source.value("TOKEN", None) == "deployment"
    assert source.value("OTHER", "alice") is None


def test_a_directory_is_read_at_each_use_with_an_owners_subdirectory_first(
    tmp_path: Path,
) -> None:
    (tmp_path / "TOKEN").write_text("deployment\n")
    (tmp_path / "alice").mkdir()
    (tmp_path / "alice" / "TOKEN").write_text("alices")
    source = Secrets([DirectorySource(tmp_path)])
    assert source.value("TOKEN", "alice") == "alices"
    assert source.value("TOKEN", "bob") == "deployment"
    (tmp_path / "TOKEN").write_text("rotated")
    assert source.value("TOKEN", "bob") == "rotated"
    for odd in ("..", ".", "a/b", "a\0b", ""):
        assert source.value("TOKEN", odd) == "rotated"
    assert source.value("alice", None) is None


def test_json_holds_deployment_values_and_objects_of_owners() -> None:
    text = SecretStr(json.dumps({"TOKEN": "deployment", "alice": {"TOKEN": "alices"}}))
    source = Secrets([JsonSource(text)])
    assert source.value("TOKEN", "alice") == "alices"
    assert source.value("TOKEN", "bob") == "deployment"


@pytest.mark.parametrize("text", ['{"A": 1}', "[]", '{"A": "x"', '{"o": {"A": []}}'])
def test_json_that_is_not_an_object_of_strings_stops_the_process_without_showing_it(
    text: str,
) -> None:
    with pytest.raises(SecretSourceInvalid) as caught:
        JsonSource(SecretStr(text))
    assert text not in str(caught.value)


class VaultLike:
    """A source of an operator's own, as ``FLOWBEAT_SECRETS_SOURCE`` names it."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def get(self, name: str, owner: str | None) -> str | None:
        return {("TOKEN", None): "vault", ("ONLY_VAULT", "alice"): "v-alice"}.get((name, owner))


def test_every_configured_source_is_asked_in_order_owner_values_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "TOKEN").write_text("directory")
    (tmp_path / "DIR_ONLY").write_text("directory")
    monkeypatch.setenv("FLOWBEAT_SECRET_alice__DIR_ONLY", "alice-env")
    monkeypatch.setenv("FLOWBEAT_SECRET_ENV_ONLY", "env")
    settings = Settings(
        secrets_source=f"{__name__}:VaultLike",
        secrets_dir=tmp_path,
        secrets_json=SecretStr('{"TOKEN": "json", "JSON_ONLY": "json"}'),
    )
    found = secrets_of(settings)
    assert secrets_of(settings) is found
    assert found.value("TOKEN", "bob") == "vault"
    assert found.value("ONLY_VAULT", "alice") == "v-alice"
    assert found.value("DIR_ONLY", "alice") == "alice-env"
    assert found.value("DIR_ONLY", "bob") == "directory"
    assert found.value("JSON_ONLY", "bob") == "json"
    assert found.value("ENV_ONLY", "bob") == "env"


@pytest.mark.parametrize(
    "spec", ["no.such.module:Source", f"{__name__}:Missing", "no-entry", "pathlib:PurePath"]
)
def test_a_source_that_does_not_load_stops_the_process(spec: str) -> None:
    with pytest.raises(SecretSourceInvalid):
        secrets_of(Settings(secrets_source=spec))


def test_a_source_without_get_is_refused() -> None:
    with pytest.raises(SecretSourceInvalid):
        secrets_of(Settings(secrets_source="builtins:str"))


def test_require_names_every_missing_secret_and_no_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWBEAT_SECRET_HAVE", "the-value")
    source = Secrets([EnvironmentSource()])
    source.require({"HAVE"}, "alice")
    source.require(set(), "alice")
    with pytest.raises(SecretNotFound) as caught:
        source.require({"HAVE", "B_MISSING", "A_MISSING"}, "alice")
    assert caught.value.details == {"secrets": ["A_MISSING", "B_MISSING"]}
    assert "the-value" not in str(caught.value)


# The mask


def test_a_mask_hides_a_value_as_written_percent_encoded_and_json_escaped() -> None:
    mask = Mask()
    assert not mask and mask.text('s3 cr"t') == 's3 cr"t'
    mask.add('s3 cr"t')
    mask.add("")
    assert mask
    line = 'plain s3 cr"t, url s3%20cr%22t, form s3+cr%22t, json "s3 cr\\"t"'
    assert mask.text(line) == f'plain {MASKED}, url {MASKED}, form {MASKED}, json "{MASKED}"'
    assert "s3" not in repr(mask)


def test_a_mask_hides_the_longer_of_two_values_whole_and_masks_keys_too() -> None:
    mask = Mask()
    mask.add("abc")
    mask.add("abcdef")
    assert mask.text("xabcdefx abc") == f"x{MASKED}x {MASKED}"
    data = {"abc": ["abcdef", 1, None, {"k": "the abc"}]}
    assert mask.data(data) == {MASKED: [MASKED, 1, None, {"k": f"the {MASKED}"}]}


def test_secret_in_host_reads_literal_text_only() -> None:
    assert secret_in_host("https://h/${{ secrets.K }}") is None
    ref = secret_in_host("https:${{ params.x }}//h/${{ secrets.K }}")
    assert ref is not None and ref.name == "K"
