"""Schedules: save, read, list and delete; firing them is ``service.triggers.firing``'s.

A pipeline may have several schedules, each with its own id, optional name, params and
priority. Functions that take ``schedule`` (an id or a name) leave it ``None`` for the
one-schedule routes, which mean the pipeline's only schedule and refuse when it has several.
Functions flush; the caller commits.
"""

import logging
import uuid
from collections.abc import Collection
from dataclasses import dataclass, replace
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.language.cron import (
    NormalizedSchedule,
    ScheduleSpec,
    Timing,
    min_gap_s,
    next_fire,
    normalize,
)
from service.language.params import resolve_params
from service.language.profiles import Profile
from service.platform.constants import SCHEDULE_LIST_MAX, SCHEDULES_CHANNEL
from service.platform.egress import check_notify_url
from service.platform.errors import (
    ScheduleAmbiguous,
    ScheduleLimitReached,
    ScheduleNameMismatch,
    ScheduleNameTaken,
    ScheduleNotFound,
    ScheduleTooFrequent,
)
from service.platform.models import JobRow, ScheduleRow
from service.platform.settings import Settings
from service.platform.states import JOB_FINAL, JobStatus

log = logging.getLogger(__name__)

OPEN_STATUSES = tuple(status.value for status in JobStatus if status not in JOB_FINAL)


@dataclass(frozen=True)
class ScheduleSummary:
    schedule: ScheduleRow
    last_status: str | None
    run_count: int


PIPELINE_ORDER = (ScheduleRow.name.asc().nulls_first(), ScheduleRow.created_at, ScheduleRow.id)
"""A pipeline's schedules as every surface lists them: unnamed first, then by name."""


def timing_of(row: ScheduleRow) -> Timing:
    return Timing(cron=row.cron, every_s=row.every_s, timezone=row.timezone)


def _lock_owner(session: Session, owner: str) -> None:
    """Serialises an owner's saves so two of them cannot both pass the limit or take a name."""
    session.execute(select(func.pg_advisory_xact_lock(func.hashtext(f"schedules:{owner}"))))


def _as_id(reference: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(reference)
    except ValueError:
        return None


def find_schedule(
    session: Session,
    *,
    owner: str,
    pipeline: str,
    schedule: str | None = None,
    for_update: bool = False,
) -> ScheduleRow:
    """The schedule ``schedule`` (an id or a name) of the owner's ``pipeline``; without one,
    the pipeline's only schedule, so the one-schedule routes mean what they always meant and
    refuse, naming the candidates, rather than pick one of several."""
    query = select(ScheduleRow).where(ScheduleRow.owner == owner, ScheduleRow.pipeline == pipeline)
    if schedule is not None:
        schedule_id = _as_id(schedule)
        query = query.where(
            ScheduleRow.id == schedule_id
            if schedule_id is not None
            else ScheduleRow.name == schedule
        )
    if for_update:
        query = query.with_for_update()
    rows = list(session.scalars(query.order_by(*PIPELINE_ORDER)))
    if not rows:
        details = {"pipeline": pipeline, "schedule": schedule}
        if schedule is None:
            raise ScheduleNotFound(f"pipeline {pipeline!r} has no schedule", details)
        raise ScheduleNotFound(f"pipeline {pipeline!r} has no schedule {schedule!r}", details)
    if len(rows) > 1:
        raise _ambiguous(pipeline, rows)
    return rows[0]


def _ambiguous(pipeline: str, rows: Collection[ScheduleRow]) -> ScheduleAmbiguous:
    listed = ", ".join(f"{r.id} ({r.name})" if r.name else str(r.id) for r in rows)
    return ScheduleAmbiguous(
        f"pipeline {pipeline!r} has {len(rows)} schedules; name one by its id or name: {listed}",
        {"pipeline": pipeline, "schedules": [{"id": str(r.id), "name": r.name} for r in rows]},
    )


def _checked(
    profile: Profile, spec: ScheduleSpec, settings: Settings, now: datetime
) -> NormalizedSchedule:
    """Everything about a spec that needs no lock, checked before anything is written."""
    schedule = normalize(spec)
    resolve_params(profile, schedule.params)
    check_notify_url(settings, schedule.notify_url)
    gap = min_gap_s(schedule.timing, now)
    if gap < settings.schedule_min_interval_s:
        raise ScheduleTooFrequent(
            f"fires every {gap:.0f}s at the closest; "
            f"the minimum interval is {settings.schedule_min_interval_s:.0f}s",
            {"min_gap_s": gap, "min_interval_s": settings.schedule_min_interval_s},
        )
    return schedule


def _check_name_free(
    session: Session, owner: str, pipeline: str, name: str, keep: uuid.UUID | None
) -> None:
    query = select(ScheduleRow.id).where(
        ScheduleRow.owner == owner, ScheduleRow.pipeline == pipeline, ScheduleRow.name == name
    )
    if keep is not None:
        query = query.where(ScheduleRow.id != keep)
    taken = session.scalar(query)
    if taken is not None:
        raise ScheduleNameTaken(
            f"pipeline {pipeline!r} already has a schedule named {name!r}",
            {"pipeline": pipeline, "name": name, "id": str(taken)},
        )


def _check_active_limit(
    session: Session, owner: str, settings: Settings, keep: uuid.UUID | None
) -> None:
    """Refuses enabling one more schedule when the owner's others already fill the limit;
    ``keep`` is the schedule being saved, which does not count against itself."""
    query = (
        select(func.count())
        .select_from(ScheduleRow)
        .where(ScheduleRow.owner == owner, ScheduleRow.enabled)
    )
    if keep is not None:
        query = query.where(ScheduleRow.id != keep)
    active = session.scalar(query)
    limit = settings.schedule_max_active_per_owner
    if (active or 0) >= limit:
        raise ScheduleLimitReached(
            f"{owner!r} already has {active} enabled schedules; the limit is {limit}",
            {"active": active, "limit": limit},
        )


def _store(
    session: Session,
    row: ScheduleRow | None,
    schedule: NormalizedSchedule,
    *,
    owner: str,
    pipeline: str,
    settings: Settings,
    now: datetime,
) -> ScheduleRow:
    """Create (``row`` None) or replace a schedule under the owner's lock. A name left out
    keeps the schedule's name; a schedule whose timing is unchanged keeps its next fire time.
    The save notifies ``SCHEDULES_CHANNEL``, which PostgreSQL delivers when the caller
    commits, so the sleeping scheduler leader reads it at once rather than at its next tick."""
    keep = row.id if row is not None else None
    if schedule.name is not None:
        _check_name_free(session, owner, pipeline, schedule.name, keep)
    if schedule.enabled:
        _check_active_limit(session, owner, settings, keep)
    if row is None:
        row = ScheduleRow(id=uuid.uuid4(), owner=owner, pipeline=pipeline, created_at=now)
        session.add(row)
    keep_next = (
        row.next_fire_at is not None
        and row.enabled
        and schedule.enabled
        and timing_of(row) == schedule.timing
    )
    if schedule.name is not None:
        row.name = schedule.name
    row.cron = schedule.timing.cron
    row.every_s = schedule.timing.every_s
    row.timezone = schedule.timing.timezone
    row.params = schedule.params
    row.enabled = schedule.enabled
    row.overlap = schedule.overlap
    row.catchup = schedule.catchup
    row.catchup_window_s = schedule.catchup_window_s
    row.jitter_s = schedule.jitter_s
    row.diff_mode = schedule.diff_mode
    row.notify_url = schedule.notify_url
    row.timeout_s = schedule.timeout_s
    row.priority = schedule.priority
    row.labels = schedule.labels
    row.updated_at = now
    if not keep_next:
        row.next_fire_at = next_fire(schedule.timing, now) if schedule.enabled else None
        row.buffered_fire_at = None
    session.flush()
    session.execute(select(func.pg_notify(SCHEDULES_CHANNEL, str(row.id))))
    return row


def create_schedule(
    session: Session,
    *,
    owner: str,
    profile: Profile,
    spec: ScheduleSpec,
    settings: Settings,
    now: datetime,
) -> ScheduleRow:
    """One more schedule of ``profile``, beside any it has; refuses before writing anything."""
    schedule = _checked(profile, spec, settings, now)
    _lock_owner(session, owner)
    return _store(
        session, None, schedule, owner=owner, pipeline=profile.name, settings=settings, now=now
    )


def spec_of(row: ScheduleRow) -> ScheduleSpec:
    """A stored schedule as the spec that saves it again unchanged, for a change to a field or
    two (``flowbeat schedules set``) that keeps all the others."""
    return ScheduleSpec.model_validate(
        {
            "name": row.name,
            "cron": row.cron,
            "every": row.every_s,
            "timezone": row.timezone,
            "params": row.params,
            "enabled": row.enabled,
            "overlap": row.overlap,
            "catchup": row.catchup,
            "catchup_window": row.catchup_window_s,
            "jitter": row.jitter_s,
            "diff_mode": row.diff_mode,
            "notify_url": row.notify_url,
            "priority": row.priority,
            "labels": row.labels,
        }
    )


def set_schedule(
    session: Session,
    *,
    owner: str,
    profile: Profile,
    schedule: str,
    spec: ScheduleSpec,
    settings: Settings,
    now: datetime,
) -> tuple[ScheduleRow, bool]:
    """Replace the schedule ``schedule`` (an id or a name), or create it when it is a name the
    pipeline has no schedule of yet, so a named schedule can be declared the same way twice;
    True when created. Creating under a name, the spec may repeat that name but not give
    another; an id must exist."""
    checked = _checked(profile, spec, settings, now)
    _lock_owner(session, owner)
    try:
        row = find_schedule(
            session, owner=owner, pipeline=profile.name, schedule=schedule, for_update=True
        )
    except ScheduleNotFound:
        if _as_id(schedule) is not None:
            raise
        if checked.name not in (None, schedule):
            raise ScheduleNameMismatch(
                f"schedule {schedule!r} does not exist to be renamed {checked.name!r}",
                {"schedule": schedule, "name": checked.name},
            ) from None
        named = replace(checked, name=schedule)
        created = _store(
            session, None, named, owner=owner, pipeline=profile.name, settings=settings, now=now
        )
        return created, True
    stored = _store(
        session, row, checked, owner=owner, pipeline=profile.name, settings=settings, now=now
    )
    return stored, False


def put_schedule(
    session: Session,
    *,
    owner: str,
    profile: Profile,
    spec: ScheduleSpec,
    settings: Settings,
    now: datetime,
) -> ScheduleRow:
    """The one-schedule save: create the pipeline's schedule, or replace it when it has one;
    refused with ``schedule_ambiguous`` when it has several."""
    checked = _checked(profile, spec, settings, now)
    _lock_owner(session, owner)
    rows = list(
        session.scalars(
            select(ScheduleRow)
            .where(ScheduleRow.owner == owner, ScheduleRow.pipeline == profile.name)
            .order_by(*PIPELINE_ORDER)
            .with_for_update()
        )
    )
    if len(rows) > 1:
        raise _ambiguous(profile.name, rows)
    row = rows[0] if rows else None
    return _store(
        session, row, checked, owner=owner, pipeline=profile.name, settings=settings, now=now
    )


def set_schedule_enabled(
    session: Session,
    *,
    owner: str,
    pipeline: str,
    enabled: bool,
    settings: Settings,
    now: datetime,
    schedule: str | None = None,
) -> ScheduleRow:
    """Pause or resume a schedule, keeping everything else about it. Paused, it has no next
    fire; resumed, it fires next from ``now`` (missed fires are not caught up), within the
    owner's limit of enabled schedules. The scheduler is woken as by a save."""
    _lock_owner(session, owner)
    row = find_schedule(session, owner=owner, pipeline=pipeline, schedule=schedule, for_update=True)
    if row.enabled == enabled:
        return row
    if enabled:
        _check_active_limit(session, owner, settings, row.id)
    row.enabled = enabled
    row.next_fire_at = next_fire(timing_of(row), now) if enabled else None
    row.buffered_fire_at = None
    row.updated_at = now
    session.flush()
    session.execute(select(func.pg_notify(SCHEDULES_CHANNEL, str(row.id))))
    return row


def get_schedule(
    session: Session, *, owner: str, pipeline: str, schedule: str | None = None
) -> ScheduleRow:
    return find_schedule(session, owner=owner, pipeline=pipeline, schedule=schedule)


def delete_schedule(
    session: Session, *, owner: str, pipeline: str, schedule: str | None = None
) -> ScheduleRow:
    """Jobs it created stay, with ``schedule_id`` cleared; its fire records go with it. The
    deleted row is returned for the caller to say which it was."""
    row = get_schedule(session, owner=owner, pipeline=pipeline, schedule=schedule)
    session.delete(row)
    session.flush()
    return row


def summarize(session: Session, rows: Collection[ScheduleRow]) -> list[ScheduleSummary]:
    last_ids = [row.last_job_id for row in rows if row.last_job_id is not None]
    statuses = {
        job_id: status
        for job_id, status in session.execute(
            select(JobRow.id, JobRow.status).where(JobRow.id.in_(last_ids))
        )
    }
    return [
        ScheduleSummary(
            schedule=row,
            last_status=statuses.get(row.last_job_id) if row.last_job_id else None,
            run_count=row.run_count,
        )
        for row in rows
    ]


def list_schedules(
    session: Session, *, owner: str | None, pipeline: str | None = None
) -> list[ScheduleSummary]:
    query = select(ScheduleRow).order_by(ScheduleRow.owner, ScheduleRow.pipeline, *PIPELINE_ORDER)
    if owner is not None:
        query = query.where(ScheduleRow.owner == owner)
    if pipeline is not None:
        query = query.where(ScheduleRow.pipeline == pipeline)
    return summarize(session, list(session.scalars(query.limit(SCHEDULE_LIST_MAX))))


def next_fires(session: Session, *, owner: str | None, limit: int) -> list[ScheduleRow]:
    """The enabled schedules that fire soonest, read in order from their index."""
    query = (
        select(ScheduleRow)
        .where(ScheduleRow.enabled, ScheduleRow.next_fire_at.is_not(None))
        .order_by(ScheduleRow.next_fire_at, ScheduleRow.id)
        .limit(limit)
    )
    if owner is not None:
        query = query.where(ScheduleRow.owner == owner)
    return list(session.scalars(query))
