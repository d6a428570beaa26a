"""The lock files agree with the ranges in pyproject.toml, so ``make lock`` is never forgotten.

Regenerating a lock needs the package index; these checks do not: each range that pyproject
names is pinned, with hashes, at a version inside it.
"""

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PIN = re.compile(r"^([A-Za-z0-9._-]+)==([^\s;\\]+)")
RUNTIME = [Requirement(spec) for spec in PYPROJECT["project"]["dependencies"]]
BUILD = [Requirement(spec) for spec in PYPROJECT["build-system"]["requires"]]
DEV = [Requirement(spec) for spec in PYPROJECT["project"]["optional-dependencies"]["dev"]]


def _pins(name: str) -> dict[str, Version]:
    lines = (ROOT / name).read_text().splitlines()
    return {
        canonicalize_name(found[1]): Version(found[2])
        for line in lines
        if (found := PIN.match(line))
    }


def _unpinned(lock: str, requirements: list[Requirement]) -> list[str]:
    pins = _pins(lock)
    return [
        str(req)
        for req in requirements
        if pins.get(canonicalize_name(req.name)) is None
        or not req.specifier.contains(pins[canonicalize_name(req.name)], prereleases=True)
    ]


@pytest.mark.parametrize(
    ("lock", "requirements"),
    [
        ("requirements.lock", RUNTIME + BUILD),
        ("requirements-dev.lock", RUNTIME + BUILD + DEV),
    ],
)
def test_every_range_in_pyproject_is_pinned_inside_it(
    lock: str, requirements: list[Requirement]
) -> None:
    assert _unpinned(lock, requirements) == [], f"run `make lock`: {lock} is stale"


@pytest.mark.parametrize("lock", ["requirements.lock", "requirements-dev.lock"])
def test_every_pin_carries_hashes(lock: str) -> None:
    text = (ROOT / lock).read_text()
    blocks = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 2)[2])
    assert blocks and all("--hash=sha256:" in block for block in blocks if PIN.match(block))


def test_the_image_lock_holds_no_test_or_lint_tools() -> None:
    pins = _pins("requirements.lock")
    assert not {"pytest", "mypy", "ruff", "testcontainers", "uv"} & set(pins)


def test_the_locked_build_group_is_the_build_backend() -> None:
    assert PYPROJECT["dependency-groups"]["build"] == PYPROJECT["build-system"]["requires"]
