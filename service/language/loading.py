"""Reading profiles: from text (YAML or JSON, size- and alias-bounded), and from the profile
directories by name."""

import logging
import os
import re
import stat
from collections.abc import Collection
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from service.language.actionnames import action_names
from service.language.checks import _error, _raise_invalid, validate_profile
from service.language.profiles import Profile
from service.language.specs import NAME_PATTERN
from service.language.yamlsafe import YamlLimitExceeded, load_yaml
from service.platform.constants import SHIPPED_DIR
from service.platform.errors import (
    ProfileNotFound,
)

MAX_PROFILE_BYTES = 256 * 1024
MAX_DOCUMENT_NODES = 100_000
log = logging.getLogger(__name__)
PROFILE_SUFFIXES = (".yaml", ".yml")


def _too_many_nodes(data: Any) -> bool:
    """YAML aliases can make a small file expand to a huge or recursive object graph."""
    budget = MAX_DOCUMENT_NODES
    stack = [data]
    while stack:
        budget -= 1
        if budget < 0:
            return True
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def load_profile_text(
    text: str, *, source: str, known_actions: Collection[str] | None = None
) -> Profile:
    return validate_profile(
        load_profile_document(text, source=source), source=source, known_actions=known_actions
    )


def load_profile_document(text: str, *, source: str) -> Any:
    """The YAML (or JSON) document of a profile's text, not yet validated: a command that
    submits a file reads it here, so a syntax error is the same ``profile_invalid`` with its
    line and column that saving the file gives."""
    size = len(text.encode("utf-8", errors="replace"))
    if size > MAX_PROFILE_BYTES:
        message = f"profile is {size} bytes, the limit is {MAX_PROFILE_BYTES}"
        _raise_invalid(source, [_error("too_large", message)])
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        column = mark.column + 1 if mark is not None else None
        code = exc.kind if isinstance(exc, YamlLimitExceeded) else "yaml_syntax"
        where = f" at line {line}, column {column}" if mark is not None else ""
        entry = _error(code, f"invalid YAML{where}: {getattr(exc, 'problem', None) or exc}")
        entry.update(line=line, column=column)
        _raise_invalid(source, [entry], line=line, column=column)
    if _too_many_nodes(data):
        message = f"document expands to more than {MAX_DOCUMENT_NODES} values"
        _raise_invalid(source, [_error("too_large", message)])
    return data


def load_profile_file(path: Path, *, known_actions: Collection[str] | None = None) -> Profile:
    source = str(path)
    if path.stat().st_size > MAX_PROFILE_BYTES:
        message = f"profile is {path.stat().st_size} bytes, the limit is {MAX_PROFILE_BYTES}"
        _raise_invalid(source, [_error("too_large", message)])
    return load_profile_text(
        path.read_text(encoding="utf-8"), source=source, known_actions=known_actions
    )


def _profile_path(profiles_dir: Path, name: str) -> tuple[Path, os.stat_result] | None:
    """The file for ``name`` directly inside ``profiles_dir``, and its stat; a symlink leading
    elsewhere counts as absent so a profile directory cannot be used to read arbitrary files.

    ``name`` holds no separator, so a regular file found by ``lstat`` is inside the directory
    by construction: one system call, where resolving every path costs one per component on
    each job submitted. Only a symlink needs resolving."""
    for suffix in PROFILE_SUFFIXES:
        candidate = profiles_dir / f"{name}{suffix}"
        try:
            found = candidate.lstat()
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            log.warning("profile %s cannot be read: %s", candidate, exc)
            continue
        if stat.S_ISREG(found.st_mode):
            return candidate, found
        if not stat.S_ISLNK(found.st_mode):
            continue
        target = candidate.resolve()
        if target.parent == profiles_dir.resolve() and target.is_file():
            return target, target.stat()
    return None


@lru_cache(maxsize=256)
def _load_file_cached(
    path: Path, mtime_ns: int, size: int, known_actions: frozenset[str] | None
) -> Profile:
    """Saved profiles are read on every job; parse each version of a file once."""
    del mtime_ns, size
    return load_profile_file(path, known_actions=known_actions)


def search_dirs(profiles_dir: Path | None) -> list[Path]:
    """The operator's directory first, so a file of theirs takes the place of a shipped profile
    of the same name (and of its data files), then the shipped profiles."""
    if profiles_dir is None or profiles_dir == SHIPPED_DIR:
        return [SHIPPED_DIR]
    return [profiles_dir, SHIPPED_DIR]


def profile_file_exists(profiles_dir: Path | None, name: str) -> bool:
    """Whether ``name`` is a profile file, the operator's or shipped: such names are not saved."""
    return any(_profile_path(directory, name) for directory in search_dirs(profiles_dir))


def find_profile(
    profiles_dir: Path | None, name: str, *, known_actions: Collection[str] | None = None
) -> Profile:
    """``name`` from the operator's ``profiles_dir`` if it holds one, else a shipped profile."""
    if not re.fullmatch(NAME_PATTERN, name):
        _raise_invalid(name, [_error("bad_name", f"invalid profile name {name!r}", "name")])
    found = next((hit for d in search_dirs(profiles_dir) if (hit := _profile_path(d, name))), None)
    if found is None:
        raise ProfileNotFound(f"no profile named {name!r}", {"name": name})
    path, file_stat = found
    actions = action_names(known_actions) if known_actions is not None else None
    profile = _load_file_cached(path, file_stat.st_mtime_ns, file_stat.st_size, actions)
    if profile.name != name:
        message = f"profile name {profile.name!r} does not match file name {name!r}"
        _raise_invalid(str(path), [_error("name_mismatch", message, "name")])
    if profile.on is not None:
        message = (
            "on: is recorded when a pipeline is saved (flowbeat pipelines save FILE), for its "
            "owner; a profile file serves every owner and cannot carry triggers"
        )
        _raise_invalid(str(path), [_error("on_in_file", message, "on")])
    return profile


def list_profiles(
    profiles_dir: Path | None, *, known_actions: Collection[str] | None = None
) -> list[Profile]:
    """Every profile of ``profiles_dir`` and the shipped ones; an invalid file raises rather
    than silently vanishing, and a directory that can no longer be read (it was checked at start)
    is skipped with a warning rather than failing every listing."""
    stems: set[str] = set()
    for directory in search_dirs(profiles_dir):
        try:
            stems |= {p.stem for p in directory.iterdir() if p.suffix in PROFILE_SUFFIXES}
        except OSError as exc:
            log.warning("profiles in %s cannot be listed: %s", directory, exc)
    profiles = [
        find_profile(profiles_dir, stem, known_actions=known_actions) for stem in sorted(stems)
    ]
    return sorted(profiles, key=lambda profile: profile.name)
