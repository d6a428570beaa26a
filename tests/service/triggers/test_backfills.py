"""Backfills in PostgreSQL: refused before anything is stored, started oldest first within
``max_active``, each fire once across backfills and the schedule's own fires, cancelled whole."""

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from service.catalogue.retention import prune_fires
from service.engine.runtime import Runtime
from service.language.cron import ScheduleSpec
from service.language.loading import find_profile
from service.platform.audit import Actor
from service.platform.db import unit_of_work
from service.platform.errors import (
    BackfillConflict,
    BackfillInvalid,
    BackfillNotCron,
    BackfillTooLarge,
)
from service.platform.models import (
    AuditEventRow,
    BackfillRow,
    JobRow,
    ScheduleFireRow,
    ScheduleRow,
)
from service.platform.settings import Settings, get_settings
from service.triggers.backfills import (
    BackfillRange,
    Ended,
    cancel_backfill,
    create_backfill,
    fires_of,
    list_backfills,
    progress,
    top_up,
)
from service.triggers.firing import fire_schedule
from service.triggers.schedules import put_schedule
from tests.support.arrange import walk

NOW = datetime(2026, 3, 1, tzinfo=UTC)
DAILY_9_BERLIN = {"cron": "0 9 * * *", "timezone": "Europe/Berlin"}


@pytest.fixture
def owner(runtime: Runtime) -> Iterator[str]:
    """An owner of its own, whose backfills are cancelled afterwards: a beat of a later test
    sharing the database would start their fires."""
    name = f"owner-{uuid.uuid4().hex[:8]}"
    yield name
    with unit_of_work(runtime.sessions) as session:
        session.execute(
            update(BackfillRow)
            .where(BackfillRow.owner == name, BackfillRow.status == "running")
            .values(status="cancelled")
        )
        for job_id in session.scalars(select(JobRow.id).where(JobRow.owner == name)):
            walk(session, JobRow, JobRow.id == job_id, to="cancelled")


@pytest.fixture
def settings() -> Settings:
    return get_settings().model_copy(update={"backfill_max_fires": 40})


@pytest.fixture
def session(runtime: Runtime) -> Iterator[Session]:
    with unit_of_work(runtime.sessions) as session:
        yield session


def schedule(session: Session, settings: Settings, owner: str, **spec: Any) -> ScheduleRow:
    profile = find_profile(settings.profiles_dir, "slow")
    body = ScheduleSpec.model_validate({**DAILY_9_BERLIN, **spec})
    return put_schedule(
        session, owner=owner, profile=profile, spec=body, settings=settings, now=NOW
    )


def backfill(
    session: Session,
    settings: Settings,
    owner: str,
    start: datetime,
    end: datetime,
    max_active: int = 2,
    now: datetime = NOW,
) -> BackfillRow:
    return create_backfill(
        session,
        owner=owner,
        pipeline="slow",
        schedule=None,
        span=BackfillRange(start, end, max_active),
        settings=settings,
        actor=_actor(owner),
        now=now,
    )


def _actor(owner: str) -> Actor:
    return Actor("cli", "flowbeat schedules backfill", "tester", owner)


def _cancel(session: Session, owner: str, row: BackfillRow) -> tuple[BackfillRow, Ended]:
    """Cancel the backfill of the owner's ``slow`` schedule, as the CLI does."""
    return cancel_backfill(
        session,
        owner=owner,
        pipeline="slow",
        schedule=None,
        backfill_id=row.id,
        actor=_actor(owner),
        now=NOW,
    )


def fill(session: Session, runtime: Runtime, row: BackfillRow) -> list[datetime]:
    """One top-up, as the scheduler leader's tick does it; the fire times it started."""
    started = top_up(
        session,
        row.id,
        profiles_dir=runtime.settings.profiles_dir,
        known_actions=runtime.registry.names(),
        now=NOW,
    )
    return [job.scheduled_for for job in started.jobs if job.scheduled_for is not None]


def finish(session: Session, row: BackfillRow) -> None:
    for fire in fires_of(session, row.id):
        if fire.job_id is not None:
            walk(session, JobRow, JobRow.id == fire.job_id, to="succeeded")


def nine_berlin(day: int, month: int = 1) -> datetime:
    """9:00 in Berlin in winter is 8:00 UTC."""
    return datetime(2026, month, day, 8, tzinfo=UTC)


def backfills_of(session: Session, owner: str) -> int:
    query = select(func.count()).select_from(BackfillRow).where(BackfillRow.owner == owner)
    return session.scalar(query) or 0


@pytest.mark.parametrize(
    ("start", "end", "max_active", "error"),
    [
        (nine_berlin(5), nine_berlin(1), 1, BackfillInvalid),
        (nine_berlin(1), nine_berlin(1), 1, BackfillInvalid),
        (nine_berlin(1), NOW + timedelta(days=1), 1, BackfillInvalid),
        (nine_berlin(1), nine_berlin(3), 0, BackfillInvalid),
        (
            nine_berlin(1, 1) + timedelta(hours=1),
            nine_berlin(1, 1) + timedelta(hours=2),
            1,
            BackfillInvalid,
        ),
        (nine_berlin(1), nine_berlin(15, 2), 1, BackfillTooLarge),
    ],
    ids=["backwards", "empty", "future", "max-active-0", "no-fire-in-range", "too-many-fires"],
)
def test_a_bad_backfill_is_refused_and_nothing_is_stored(
    session: Session,
    settings: Settings,
    owner: str,
    start: datetime,
    end: datetime,
    max_active: int,
    error: type[Exception],
) -> None:
    schedule(session, settings, owner)
    with pytest.raises(error):
        backfill(session, settings, owner, start, end, max_active)
    assert backfills_of(session, owner) == 0


def test_only_a_cron_schedule_is_backfilled(
    session: Session, settings: Settings, owner: str
) -> None:
    schedule(session, settings, owner, cron=None, every="1d")
    with pytest.raises(BackfillNotCron):
        backfill(session, settings, owner, nine_berlin(1), nine_berlin(5))
    assert backfills_of(session, owner) == 0


def test_fires_start_oldest_first_in_the_schedules_zone_at_most_max_active_open(
    session: Session, runtime: Runtime, settings: Settings, owner: str
) -> None:
    schedule(session, settings, owner)
    row = backfill(session, settings, owner, nine_berlin(1), nine_berlin(6), max_active=2)
    assert row.total == 5
    assert fill(session, runtime, row) == [nine_berlin(1), nine_berlin(2)]
    assert fill(session, runtime, row) == []
    finish(session, row)
    assert fill(session, runtime, row) == [nine_berlin(3), nine_berlin(4)]
    finish(session, row)
    assert fill(session, runtime, row) == [nine_berlin(5)]
    assert row.status == "running"
    finish(session, row)
    assert fill(session, runtime, row) == []
    assert row.status == "completed"
    (done,) = progress(session, [row])
    assert (done.started, done.pending, done.jobs) == (5, 0, {"succeeded": 5})


def test_a_summer_fire_is_at_nine_local_time(
    session: Session, runtime: Runtime, settings: Settings, owner: str
) -> None:
    schedule(session, settings, owner)
    july = datetime(2025, 7, 1, tzinfo=UTC)
    row = backfill(session, settings, owner, july, july + timedelta(days=1), max_active=1)
    assert fill(session, runtime, row) == [datetime(2025, 7, 1, 7, tzinfo=UTC)]


def test_an_overlapping_backfill_starts_no_fire_twice(
    session: Session, runtime: Runtime, settings: Settings, owner: str
) -> None:
    schedule(session, settings, owner)
    first = backfill(session, settings, owner, nine_berlin(1), nine_berlin(4), max_active=5)
    assert fill(session, runtime, first) == [nine_berlin(1), nine_berlin(2), nine_berlin(3)]
    later = NOW + timedelta(minutes=1)
    second = backfill(session, settings, owner, nine_berlin(2), nine_berlin(6), 5, later)
    assert fill(session, runtime, second) == [nine_berlin(4), nine_berlin(5)]
    assert second.skipped == 2
    (listed_second, listed_first) = list_backfills(
        session, owner=owner, pipeline="slow", schedule=None
    )
    assert listed_first.backfill.id == first.id
    assert (listed_second.started, listed_second.backfill.skipped) == (2, 2)


def test_a_fire_the_schedule_ran_is_skipped_and_one_it_skipped_is_run(
    session: Session, runtime: Runtime, settings: Settings, owner: str
) -> None:
    row = schedule(session, settings, owner)
    session.execute(
        update(ScheduleRow).where(ScheduleRow.id == row.id).values(next_fire_at=nine_berlin(1))
    )
    session.refresh(row)
    fired = fire_schedule(
        session,
        row.id,
        now=nine_berlin(1),
        grace_s=90,
        profiles_dir=runtime.settings.profiles_dir,
        known_actions=runtime.registry.names(),
    )
    assert [job.scheduled_for for job in fired.jobs] == [nine_berlin(1)]
    session.add(ScheduleFireRow(schedule_id=row.id, fire_at=nine_berlin(2), outcome="skipped"))
    session.flush()
    bf = backfill(session, settings, owner, nine_berlin(1), nine_berlin(3), max_active=5)
    assert fill(session, runtime, bf) == [nine_berlin(2)]
    assert bf.skipped == 1
    fences = session.scalars(
        select(ScheduleFireRow.outcome).where(ScheduleFireRow.schedule_id == row.id)
    ).all()
    assert sorted(fences) == ["created", "created"]


def test_a_cancelled_backfill_cancels_its_open_jobs_and_starts_no_more(
    session: Session, runtime: Runtime, settings: Settings, owner: str
) -> None:
    schedule(session, settings, owner)
    row = backfill(session, settings, owner, nine_berlin(1), nine_berlin(6), max_active=2)
    fill(session, runtime, row)
    cancelled, _ = _cancel(session, owner, row)
    assert cancelled.status == "cancelled"
    assert fill(session, runtime, row) == []
    (listed,) = progress(session, [row])
    assert listed.jobs == {"cancelled": 2}
    assert listed.pending == 3
    audited = session.scalars(
        select(AuditEventRow.action).where(AuditEventRow.target_id == str(row.id))
    ).all()
    assert sorted(audited) == ["backfill.cancel", "backfill.create"]
    again, _ = _cancel(session, owner, row)
    assert again.status == "cancelled"


def test_a_completed_backfill_cannot_be_cancelled(
    session: Session, runtime: Runtime, settings: Settings, owner: str
) -> None:
    schedule(session, settings, owner)
    row = backfill(session, settings, owner, nine_berlin(1), nine_berlin(2), max_active=1)
    fill(session, runtime, row)
    finish(session, row)
    fill(session, runtime, row)
    with pytest.raises(BackfillConflict):
        _cancel(session, owner, row)


def test_a_backfills_fire_records_outlive_the_retention_of_fire_records(
    session: Session, runtime: Runtime, settings: Settings, owner: str
) -> None:
    schedule(session, settings, owner)
    row = backfill(session, settings, owner, nine_berlin(1), nine_berlin(3), max_active=2)
    fill(session, runtime, row)
    prune_fires(session, NOW)
    assert len(fires_of(session, row.id)) == 2
