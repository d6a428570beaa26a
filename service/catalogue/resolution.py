"""What a pipeline name runs for a job's submitter: the own pipeline, then a shared one, then a
profile file; validated profiles of saved versions are cached, since a version never changes."""

import uuid
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from sqlalchemy.orm import Session

from service.catalogue.pipelines import (
    _check_name,
    _own_or_shared,
    _PipelineRef,
    _version_row,
    _visible_row,
)
from service.language.actionnames import action_names
from service.language.checks import validate_profile
from service.language.loading import (
    find_profile,
)
from service.language.profiles import Profile
from service.platform.errors import (
    ProfileInvalid,
    ProfileNotFound,
)
from service.platform.models import PipelineRow

_K = TypeVar("_K")
_V = TypeVar("_V")

RESOLVED_CACHE_SIZE = 1024

_RESOLVED: dict[tuple[uuid.UUID, int, frozenset[str]], Profile] = {}
"""Validated profiles of saved versions. A (pipeline id, version) never changes content, so
jobs that re-run a pipeline skip reading and validating its stored profile again."""

_SEEN: dict[tuple[str, str], tuple[uuid.UUID, int] | None] = {}
"""What a name last resolved to for an owner: the saved pipeline and its current version, or
``None`` for a profile file. A hint only: ``seen_resolution`` callers must check it against
PostgreSQL in the statement that stores their job
(``service.engine.submission.insert_jobs_if_resolved``)."""


@dataclass(frozen=True)
class ResolvedPipeline:
    """What a job runs: the profile, and the saved pipeline and version it came from, if any."""

    profile: Profile
    pipeline_id: uuid.UUID | None
    version: int | None


def resolve_pipeline(
    session: Session,
    name: str,
    *,
    owner: str,
    profiles_dir: Path | None,
    known_actions: Collection[str],
) -> ResolvedPipeline:
    """What a job named ``name`` submitted by ``owner`` runs: its own saved pipeline, one shared
    with it, or a shipped profile. The current version is validated against the actions known
    now, so a pipeline whose action was removed is refused before anything is stored.

    ``"alice/weekly"`` names alice's pipeline exactly, for a caller shared two pipelines of
    the same name; it never falls back to a shipped profile."""
    pipeline_owner, slash, bare = name.rpartition("/")
    _check_name(bare)
    row: PipelineRow | _PipelineRef | None
    if slash:
        row = _visible_row(session, bare, viewer=owner, owner=pipeline_owner, admin=False)
        if row is None:
            raise ProfileNotFound(
                f"no pipeline {name!r} visible to you", {"name": bare, "owner": pipeline_owner}
            )
    else:
        row = _own_or_shared(session, bare, owner)
    if row is None:
        shipped = find_profile(profiles_dir, bare, known_actions=known_actions)
        _remember(_SEEN, (owner, name), None)
        return ResolvedPipeline(shipped, None, None)
    actions = action_names(known_actions)
    key = (row.id, row.current_version, actions)
    profile = _RESOLVED.get(key)
    if profile is None:
        stored = _version_row(session, row, None)
        profile = validate_profile(
            stored.profile,
            source=f"pipeline {row.name} v{stored.version}",
            known_actions=actions,
        )
        _remember(_RESOLVED, key, profile)
    if not slash:
        _remember(_SEEN, (owner, name), (row.id, row.current_version))
    return ResolvedPipeline(profile, row.id, row.current_version)


def _remember(cache: dict[_K, _V], key: _K, value: _V) -> None:
    if key not in cache and len(cache) >= RESOLVED_CACHE_SIZE:
        cache.clear()
    cache[key] = value


def seen_resolution(
    name: str, *, owner: str, profiles_dir: Path | None, known_actions: Collection[str]
) -> ResolvedPipeline | None:
    """What ``name`` resolved to for ``owner`` the last time, without reading PostgreSQL, or
    ``None`` when that is not known here. A saved version's profile is the one validated then;
    a profile file is looked up again, as every resolution does, so an edited file is seen."""
    try:
        seen = _SEEN[(owner, name)]
    except KeyError:
        return None
    if seen is None:
        try:
            profile = find_profile(profiles_dir, name, known_actions=known_actions)
        except (ProfileNotFound, ProfileInvalid):
            return None
        return ResolvedPipeline(profile, None, None)
    pipeline_id, version = seen
    saved = _RESOLVED.get((pipeline_id, version, action_names(known_actions)))
    return None if saved is None else ResolvedPipeline(saved, pipeline_id, version)
