"""Saving, deleting and sharing pipelines: a new version only when the content hash changes,
never over a profile file's name. Functions flush; the caller commits."""

import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from service.catalogue.calls import check_calls
from service.catalogue.pipelines import (
    MAX_OWNER_LENGTH,
    SYSTEM_OWNER,
    PipelineView,
    _check_name,
    _not_found,
    _refuse_shipped_name,
    _view,
    _visible_row,
    parse_body,
)
from service.catalogue.trigger_edges import forget_triggers, record_triggers
from service.language.escalations import check_escalation_urls
from service.language.snapshots import profile_secrets
from service.platform.clock import utcnow
from service.platform.errors import (
    InvalidShare,
    PipelineNameMismatch,
    PipelineReadOnly,
)
from service.platform.models import JobRow, PipelineRow, PipelineVersionRow, ScheduleRow
from service.platform.secrets import secrets_of
from service.platform.settings import Settings


@dataclass(frozen=True)
class SaveOutcome:
    view: PipelineView
    created_version: bool


def save_pipeline(
    session: Session,
    *,
    owner: str,
    name: str | None,
    body: str | Mapping[str, Any],
    settings: Settings,
    known_actions: Collection[str],
    now: datetime | None = None,
) -> SaveOutcome:
    """Save a new version of ``owner``'s pipeline, or nothing when the content is unchanged.

    Content already saved as an older version makes that version current again instead of
    copying it, so one content hash always names one version. A new version keeps the text it
    was saved from (``source``, when ``body`` is text within ``max_body_bytes``); text that
    differs only in comments or layout is the same content, so it makes no new version and
    the version keeps the text it was first saved from. The pipeline row is locked while
    a version number is chosen, so concurrent saves number versions without gaps or clashes.
    """
    source = f"pipeline {name}" if name else "pipeline"
    profile = parse_body(body, source=source, known_actions=known_actions)
    if name is not None and profile.name != name:
        raise PipelineNameMismatch(
            f"the profile is named {profile.name!r}, not {name!r}",
            {"name": name, "profile_name": profile.name},
        )
    _refuse_shipped_name(settings.profiles_dir, profile.name)
    check_escalation_urls(settings, profile)
    secrets_of(settings).require(profile_secrets(profile), owner)
    record_triggers(session, owner, profile)
    check_calls(
        session, owner, profile, profiles_dir=settings.profiles_dir, known_actions=known_actions
    )
    now = now or utcnow()
    content_hash = profile.content_hash()
    session.execute(
        insert(PipelineRow)
        .values(
            id=uuid.uuid4(),
            owner=owner,
            name=profile.name,
            description=profile.description,
            tags=list(profile.tags),
            shared_with=[],
            current_version=0,
            created_at=now,
            updated_at=now,
        )
        .on_conflict_do_nothing(index_elements=["owner", "name"])
    )
    row = session.scalars(
        select(PipelineRow)
        .where(PipelineRow.owner == owner, PipelineRow.name == profile.name)
        .with_for_update()
    ).one()
    existing = session.scalars(
        select(PipelineVersionRow).where(
            PipelineVersionRow.pipeline_id == row.id,
            PipelineVersionRow.content_hash == content_hash,
        )
    ).one_or_none()
    created = existing is None
    if existing is None:
        latest = session.scalar(
            select(func.max(PipelineVersionRow.version)).where(
                PipelineVersionRow.pipeline_id == row.id
            )
        )
        version = (latest or 0) + 1
        kept = _kept_source(body, settings)
        session.add(
            PipelineVersionRow(
                pipeline_id=row.id,
                version=version,
                content_hash=content_hash,
                profile=profile.to_json(),
                source=kept,
                created_at=now,
            )
        )
    else:
        version = existing.version
        kept = existing.source
    if version != row.current_version:
        row.current_version = version
        row.description = profile.description
        row.tags = list(profile.tags)
        row.updated_at = now
    session.flush()
    return SaveOutcome(_view(row, profile, version, read_only=False, source=kept), created)


def _kept_source(body: str | Mapping[str, Any], settings: Settings) -> str | None:
    """The text a version keeps: a body sent as text, within the API's body limit (a file the
    CLI saves may be longer); a mapping has no text of its own."""
    if not isinstance(body, str) or len(body.encode()) > settings.max_body_bytes:
        return None
    return body


def _owned_row(
    session: Session,
    name: str,
    *,
    viewer: str,
    owner: str | None,
    admin: bool,
    profiles_dir: Path | None,
) -> PipelineRow:
    """The row the caller may change: its own, or with ``owner`` any owner's for admins."""
    _check_name(name)
    _refuse_shipped_name(profiles_dir, name)
    target = owner if owner is not None and admin else viewer
    row = session.scalars(
        select(PipelineRow)
        .where(PipelineRow.owner == target, PipelineRow.name == name)
        .with_for_update()
    ).one_or_none()
    if row is not None:
        return row
    shared = _visible_row(session, name, viewer=viewer, owner=owner, admin=admin)
    if shared is not None:
        raise PipelineReadOnly(
            f"pipeline {name!r} of {shared.owner!r} is shared read-only",
            {"name": name, "owner": shared.owner},
        )
    raise _not_found(name)


def delete_pipeline(
    session: Session,
    name: str,
    *,
    viewer: str,
    profiles_dir: Path | None,
    owner: str | None = None,
    admin: bool = False,
    purge_history: bool = False,
) -> int:
    """Delete a pipeline with its versions (and whatever cascades from it, e.g. a schedule).
    Its jobs stay as history unless ``purge_history``, which deletes the owner's own runs only:
    the runs of those it was shared with are theirs. Returns the number of jobs deleted."""
    row = _owned_row(
        session, name, viewer=viewer, owner=owner, admin=admin, profiles_dir=profiles_dir
    )
    purged = 0
    if purge_history:
        deleted = session.scalars(
            delete(JobRow)
            .where(JobRow.pipeline_id == row.id, JobRow.owner == row.owner)
            .returning(JobRow.id)
        )
        purged = len(deleted.all())
    session.execute(
        delete(ScheduleRow).where(ScheduleRow.owner == row.owner, ScheduleRow.pipeline == row.name)
    )
    forget_triggers(session, row.owner, row.name)
    session.delete(row)
    session.flush()
    return purged


def _check_grantee(grantee: str, row: PipelineRow) -> None:
    if not grantee or len(grantee) > MAX_OWNER_LENGTH or grantee == SYSTEM_OWNER:
        raise InvalidShare(f"cannot share with {grantee!r}", {"owner": grantee})
    if grantee == row.owner:
        raise InvalidShare("a pipeline cannot be shared with its owner", {"owner": grantee})


def set_share(
    session: Session,
    name: str,
    grantee: str,
    *,
    shared: bool,
    viewer: str,
    profiles_dir: Path | None,
    owner: str | None = None,
    admin: bool = False,
) -> list[str]:
    """Grant or revoke read-only use of a pipeline; both are idempotent. Returns the grantees."""
    row = _owned_row(
        session, name, viewer=viewer, owner=owner, admin=admin, profiles_dir=profiles_dir
    )
    _check_grantee(grantee, row)
    grantees = set(row.shared_with)
    if shared:
        grantees.add(grantee)
    else:
        grantees.discard(grantee)
    if grantees != set(row.shared_with):
        row.shared_with = sorted(grantees)
        row.updated_at = utcnow()
        session.flush()
    return sorted(grantees)
