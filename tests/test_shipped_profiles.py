"""The literature and data refresh profiles shipped in ``profiles/`` are valid and scheduled."""

from pathlib import Path
from typing import Any

import pytest
import yaml

from service.actions import REGISTRY, load_plugins
from service.language.checks import validate_profile
from service.language.loading import load_profile_file
from service.language.params import resolve_params
from service.platform.errors import ParamsInvalid

PROFILES = Path(__file__).resolve().parents[1] / "profiles"
SCHEDULES: dict[str, dict[str, str | bool]] = {
    "remimazolam-icu-sedation": {
        "cron": "0 9 * * 1",
        "timezone": "Europe/London",
        "diff_mode": True,
    },
    "crispr-gene-therapy": {"cron": "0 8 1 * *", "timezone": "Europe/London", "diff_mode": True},
    "data-refresh": {"cron": "0 */6 * * *", "timezone": "Europe/London"},
}


@pytest.fixture(scope="module", autouse=True)
def _builtins() -> None:
    load_plugins(REGISTRY, [], entry_points=[])


def raw(name: str) -> dict[str, Any]:
    data = yaml.safe_load((PROFILES / f"{name}.yaml").read_text())
    assert isinstance(data, dict)
    return data


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_the_file_loads_with_its_schedule(name: str) -> None:
    profile = load_profile_file(PROFILES / f"{name}.yaml", known_actions=REGISTRY.names())
    assert profile.name == name
    assert SCHEDULES[name].items() <= profile.to_json()["schedule"].items()


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_everything_but_the_schedule_block_is_valid(name: str) -> None:
    data = raw(name)
    assert {k: v for k, v in data.pop("schedule").items() if k != "params"} == SCHEDULES[name]
    profile = validate_profile(data, source=name, known_actions=REGISTRY.names())
    assert profile.name == name


@pytest.mark.parametrize("name", ["remimazolam-icu-sedation", "crispr-gene-therapy"])
def test_literature_runs_keep_their_papers_keyed_by_pmid(name: str) -> None:
    data = raw(name)
    data.pop("schedule")
    result = validate_profile(data, source=name).result
    assert result is not None
    assert result.key == "pmid"


def test_a_data_refresh_needs_a_url_and_a_table() -> None:
    data = raw("data-refresh")
    data.pop("schedule")
    profile = validate_profile(data, source="data-refresh")
    with pytest.raises(ParamsInvalid) as info:
        resolve_params(profile, {})
    assert {e["param"] for e in info.value.details["errors"]} == {"url", "table"}
    resolved = resolve_params(profile, {"url": "https://example.org/x.csv", "table": "t"})
    assert resolved["keys"] == ["id"]
    assert resolved["sha256"] is None
