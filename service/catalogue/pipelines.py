"""Saved pipelines: versioned profiles in PostgreSQL, owned by one owner, shareable read-only.

Profile files (the shipped ones, and an operator's in ``FLOWBEAT_PROFILES_DIR``) appear as
read-only pipelines of the owner ``system``; their names cannot be saved over, so a name that
runs a profile file today keeps doing so. This module reads them, as a caller sees them;
``saving`` changes them and ``resolution`` says what a name runs for a job.
"""

import re
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import case, func, or_, select
from sqlalchemy.orm import Session

from service.language.checks import validate_profile
from service.language.loading import (
    find_profile,
    list_profiles,
    load_profile_text,
    profile_file_exists,
)
from service.language.profiles import Profile
from service.language.specs import NAME_PATTERN
from service.platform.db import driver
from service.platform.errors import (
    PipelineReadOnly,
    ProfileInvalid,
    ProfileNotFound,
)
from service.platform.models import JobRow, PipelineRow, PipelineVersionRow

SYSTEM_OWNER = "system"
MAX_OWNER_LENGTH = 128


@dataclass(frozen=True)
class PipelineView:
    """A pipeline as a caller sees it; ``read_only`` when the caller may run but not change it."""

    name: str
    owner: str
    description: str
    tags: list[str]
    shared_with: list[str]
    version: int | None
    content_hash: str
    profile: Profile
    read_only: bool
    created_at: datetime | None
    updated_at: datetime | None
    run_count: int = 0
    source: str | None = None
    """The text the version was saved from, when it was kept (``PipelineVersionRow.source``)."""


@dataclass(frozen=True)
class VersionView:
    version: int
    content_hash: str
    created_at: datetime
    current: bool


def _check_name(name: str) -> None:
    if not re.fullmatch(NAME_PATTERN, name):
        raise ProfileInvalid(
            f"invalid pipeline name {name!r}",
            {
                "source": name,
                "errors": [
                    {
                        "step": None,
                        "field": "name",
                        "code": "bad_name",
                        "message": f"a name must match {NAME_PATTERN}",
                    }
                ],
            },
        )


def _shipped(profiles_dir: Path | None, name: str) -> Profile | None:
    try:
        return find_profile(profiles_dir, name)
    except ProfileNotFound:
        return None


def _refuse_shipped_name(profiles_dir: Path | None, name: str) -> None:
    if profile_file_exists(profiles_dir, name):
        raise PipelineReadOnly(
            f"{name!r} is a profile file (shipped or the operator's) and cannot be changed",
            {"name": name, "owner": SYSTEM_OWNER},
        )


def parse_body(
    body: str | Mapping[str, Any], *, source: str, known_actions: Collection[str]
) -> Profile:
    """Validate a body exactly as a profile file is validated; JSON text is YAML too."""
    if isinstance(body, str):
        return load_profile_text(body, source=source, known_actions=known_actions)
    return validate_profile(dict(body), source=source, known_actions=known_actions)


def _view(
    row: PipelineRow,
    profile: Profile,
    version: int,
    *,
    read_only: bool,
    run_count: int = 0,
    source: str | None = None,
) -> PipelineView:
    return PipelineView(
        name=row.name,
        owner=row.owner,
        description=row.description,
        tags=list(row.tags),
        shared_with=[] if read_only else sorted(row.shared_with),
        version=version,
        content_hash=profile.content_hash(),
        profile=profile,
        read_only=read_only,
        created_at=row.created_at,
        updated_at=row.updated_at,
        run_count=run_count,
        source=source,
    )


def _system_view(profile: Profile, run_count: int = 0) -> PipelineView:
    return PipelineView(
        name=profile.name,
        owner=SYSTEM_OWNER,
        description=profile.description,
        tags=list(profile.tags),
        shared_with=[],
        version=None,
        content_hash=profile.content_hash(),
        profile=profile,
        read_only=True,
        created_at=None,
        updated_at=None,
        run_count=run_count,
    )


def _stored_profile(row: PipelineRow, version: PipelineVersionRow) -> Profile:
    """Stored content was valid when saved; it is validated again without the action check,
    which ``resolve_pipeline`` makes against the actions this process knows now."""
    return validate_profile(version.profile, source=f"pipeline {row.name} v{version.version}")


def _visible_row(
    session: Session, name: str, *, viewer: str, owner: str | None, admin: bool
) -> PipelineRow | None:
    """The caller's own pipeline, else the oldest one shared with it (any owner's for
    admins); with ``owner``, that owner's pipeline if the caller may read it."""
    query = select(PipelineRow).where(PipelineRow.name == name)
    if owner is not None:
        row = session.scalars(query.where(PipelineRow.owner == owner)).one_or_none()
        if row is None or admin or owner == viewer or viewer in row.shared_with:
            return row
        return None
    if not admin:
        query = query.where(
            or_(PipelineRow.owner == viewer, PipelineRow.shared_with.contains([viewer]))
        )
    own_first = case((PipelineRow.owner == viewer, 0), else_=1)
    return session.scalars(
        query.order_by(own_first, PipelineRow.created_at, PipelineRow.owner).limit(1)
    ).first()


def own_or_shared(name: str, viewer: str) -> str:
    """The pipeline ``name`` resolves to for ``viewer`` (``_visible_row``'s order), as SQL over
    the two expressions given: parameters here, a batch's columns in ``service.engine.jobs``."""
    return f"""
    SELECT id, name, owner, current_version FROM pipelines
     WHERE name = {name}
       AND (owner = {viewer} OR shared_with @> ARRAY[{viewer}]::varchar[])
     ORDER BY owner <> {viewer}, created_at, owner
     LIMIT 1
    """


OWN_OR_SHARED = own_or_shared("%(name)s", "%(viewer)s")


@dataclass(frozen=True)
class _PipelineRef:
    id: uuid.UUID
    name: str
    owner: str
    current_version: int


def _own_or_shared(session: Session, name: str, viewer: str) -> _PipelineRef | None:
    """``_visible_row`` for a job's submitter, as one constant statement on the session's
    driver connection: the submit path runs it on every job and needs only the identity."""
    row = driver(session).execute(OWN_OR_SHARED, {"name": name, "viewer": viewer}).fetchone()
    return None if row is None else _PipelineRef(*row)


def _version_row(
    session: Session, row: PipelineRow | _PipelineRef, version: int | None
) -> PipelineVersionRow:
    wanted = row.current_version if version is None else version
    found = session.get(PipelineVersionRow, (row.id, wanted))
    if found is None:
        raise ProfileNotFound(
            f"pipeline {row.name!r} has no version {wanted}",
            {"name": row.name, "owner": row.owner, "version": wanted},
        )
    return found


def _not_found(name: str) -> ProfileNotFound:
    return ProfileNotFound(f"no pipeline named {name!r}", {"name": name})


def get_pipeline(
    session: Session,
    name: str,
    *,
    viewer: str,
    profiles_dir: Path | None,
    owner: str | None = None,
    version: int | None = None,
    admin: bool = False,
) -> PipelineView:
    """A pipeline as ``viewer`` sees it, its current version unless ``version`` is given."""
    _check_name(name)
    row = None
    if owner != SYSTEM_OWNER:
        row = _visible_row(session, name, viewer=viewer, owner=owner, admin=admin)
    if row is not None:
        stored = _version_row(session, row, version)
        read_only = row.owner != viewer and not admin
        return _view(
            row,
            _stored_profile(row, stored),
            stored.version,
            read_only=read_only,
            run_count=_saved_run_counts(session, [row.id]).get(row.id, 0),
            source=stored.source,
        )
    if owner in (None, SYSTEM_OWNER) and version is None:
        shipped = _shipped(profiles_dir, name)
        if shipped is not None:
            counts = _system_run_counts(session, [name], None if admin else viewer)
            return _system_view(shipped, counts.get(name, 0))
    raise _not_found(name)


def list_versions(
    session: Session, name: str, *, viewer: str, owner: str | None = None, admin: bool = False
) -> list[VersionView]:
    """Newest first."""
    _check_name(name)
    row = _visible_row(session, name, viewer=viewer, owner=owner, admin=admin)
    if row is None:
        raise _not_found(name)
    versions = session.scalars(
        select(PipelineVersionRow)
        .where(PipelineVersionRow.pipeline_id == row.id)
        .order_by(PipelineVersionRow.version.desc())
    )
    return [
        VersionView(v.version, v.content_hash, v.created_at, v.version == row.current_version)
        for v in versions
    ]


def _saved_run_counts(session: Session, ids: list[uuid.UUID]) -> dict[uuid.UUID, int]:
    if not ids:
        return {}
    rows = session.execute(
        select(JobRow.pipeline_id, func.count())
        .where(JobRow.pipeline_id.in_(ids))
        .group_by(JobRow.pipeline_id)
    )
    return {pipeline_id: count for pipeline_id, count in rows if pipeline_id is not None}


def _system_run_counts(session: Session, names: list[str], viewer: str | None) -> dict[str, int]:
    """Runs of shipped profiles are jobs by name that came from no saved pipeline."""
    if not names:
        return {}
    query = (
        select(JobRow.pipeline, func.count())
        .where(JobRow.pipeline.in_(names), JobRow.pipeline_id.is_(None))
        .group_by(JobRow.pipeline)
    )
    if viewer is not None:
        query = query.where(JobRow.owner == viewer)
    return {name: count for name, count in session.execute(query)}


def list_pipelines(
    session: Session,
    *,
    viewer: str,
    profiles_dir: Path | None,
    tag: str | None = None,
    admin: bool = False,
) -> list[PipelineView]:
    """Own, shared and shipped pipelines (every owner's for admins), by name then owner."""
    query = select(PipelineRow, PipelineVersionRow).join(
        PipelineVersionRow,
        (PipelineVersionRow.pipeline_id == PipelineRow.id)
        & (PipelineVersionRow.version == PipelineRow.current_version),
    )
    if not admin:
        query = query.where(
            or_(PipelineRow.owner == viewer, PipelineRow.shared_with.contains([viewer]))
        )
    if tag:
        query = query.where(PipelineRow.tags.contains([tag]))
    pairs = [(row, stored) for row, stored in session.execute(query)]
    counts = _saved_run_counts(session, [row.id for row, _ in pairs])
    views = [
        _view(
            row,
            _stored_profile(row, stored),
            stored.version,
            read_only=row.owner != viewer and not admin,
            run_count=counts.get(row.id, 0),
        )
        for row, stored in pairs
    ]
    shipped = [profile for profile in list_profiles(profiles_dir) if not tag or tag in profile.tags]
    system_counts = _system_run_counts(
        session, [profile.name for profile in shipped], None if admin else viewer
    )
    views += [_system_view(p, system_counts.get(p.name, 0)) for p in shipped]
    return sorted(views, key=lambda view: (view.name, view.owner))
