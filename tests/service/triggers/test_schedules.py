"""Schedules in PostgreSQL: limits refused before anything is stored, and what a tick fires."""

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from service.catalogue.retention import RetentionPolicy, prune_fires, prune_runs
from service.engine.runtime import Runtime
from service.language.cron import ScheduleSpec
from service.language.loading import find_profile
from service.platform.constants import FIRE_RECORDS_KEPT_S
from service.platform.db import unit_of_work
from service.platform.errors import (
    ParamsInvalid,
    ScheduleAmbiguous,
    ScheduleLimitReached,
    ScheduleNameMismatch,
    ScheduleNameTaken,
    ScheduleNotFound,
    ScheduleTooFrequent,
)
from service.platform.models import JobRow, ScheduleFireRow, ScheduleRow, StepRunRow
from service.platform.settings import Settings, get_settings
from service.triggers.firing import TickResult, cancel_overdue, fire_schedule
from service.triggers.schedules import (
    create_schedule,
    delete_schedule,
    get_schedule,
    list_schedules,
    next_fires,
    put_schedule,
    set_schedule,
    set_schedule_enabled,
    spec_of,
    summarize,
)
from tests.support.arrange import walk

T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)


@pytest.fixture
def owner() -> str:
    return f"owner-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def settings() -> Settings:
    return get_settings().model_copy(
        update={"schedule_min_interval_s": 3600, "schedule_max_active_per_owner": 2}
    )


@pytest.fixture
def session(runtime: Runtime) -> Iterator[Session]:
    with unit_of_work(runtime.sessions) as session:
        yield session


def save(
    session: Session, settings: Settings, owner: str, pipeline: str = "slow", **spec: Any
) -> ScheduleRow:
    profile = find_profile(settings.profiles_dir, pipeline)
    body = ScheduleSpec.model_validate({"every": "1h", **spec})
    return put_schedule(session, owner=owner, profile=profile, spec=body, settings=settings, now=T0)


def add(
    session: Session, settings: Settings, owner: str, pipeline: str = "slow", **spec: Any
) -> ScheduleRow:
    """One more schedule of ``pipeline``, beside those it has."""
    profile = find_profile(settings.profiles_dir, pipeline)
    body = ScheduleSpec.model_validate({"every": "1h", **spec})
    return create_schedule(
        session, owner=owner, profile=profile, spec=body, settings=settings, now=T0
    )


def fire(session: Session, runtime: Runtime, row: ScheduleRow, now: datetime) -> TickResult:
    return fire_schedule(
        session,
        row.id,
        now=now,
        grace_s=90,
        profiles_dir=runtime.settings.profiles_dir,
        known_actions=runtime.registry.names(),
    )


def schedules_of(session: Session, owner: str) -> int:
    query = select(func.count()).select_from(ScheduleRow).where(ScheduleRow.owner == owner)
    return session.scalar(query) or 0


def set_status(session: Session, job_id: uuid.UUID, status: str) -> None:
    walk(session, JobRow, JobRow.id == job_id, to=status)


def test_a_schedule_more_frequent_than_the_limit_is_refused_and_not_stored(
    session: Session, settings: Settings, owner: str
) -> None:
    with pytest.raises(ScheduleTooFrequent):
        save(session, settings, owner, every="30m")
    with pytest.raises(ScheduleTooFrequent):
        save(session, settings, owner, every=None, cron="*/10 * * * *")
    assert schedules_of(session, owner) == 0


def test_one_enabled_schedule_more_than_the_owner_limit_is_refused(
    session: Session, settings: Settings, owner: str
) -> None:
    save(session, settings, owner, "slow")
    save(session, settings, owner, "dag")
    with pytest.raises(ScheduleLimitReached):
        save(session, settings, owner, "wide")
    save(session, settings, owner, "wide", enabled=False)
    save(session, settings, owner, "slow", cron="0 9 * * *", every=None)
    assert schedules_of(session, owner) == 3


def test_params_are_checked_against_the_pipeline_when_saved(
    session: Session, settings: Settings, owner: str
) -> None:
    with pytest.raises(ParamsInvalid):
        save(session, settings, owner, params={"hold_s": "long"})
    assert schedules_of(session, owner) == 0


def test_a_due_fire_creates_one_scheduled_job_with_its_fence_row(
    session: Session, runtime: Runtime, settings: Settings, owner: str
) -> None:
    row = save(session, settings, owner, diff_mode=True, notify_url="https://example.org/hook")
    first = T0 + timedelta(hours=1)
    assert row.next_fire_at == first
    assert fire(session, runtime, row, T0 + timedelta(minutes=30)).jobs == []

    result = fire(session, runtime, row, first + timedelta(seconds=1))

    (job,) = result.jobs
    assert (job.trigger, job.schedule_id, job.scheduled_for) == ("schedule", row.id, first)
    assert (job.owner, job.diff_mode, job.notify_url) == (owner, True, "https://example.org/hook")
    assert row.next_fire_at == first + timedelta(hours=1)
    assert (row.last_fire_at, row.last_job_id) == (first, job.id)
    fence = session.scalars(select(ScheduleFireRow).where(ScheduleFireRow.schedule_id == row.id))
    assert [(f.fire_at, f.job_id, f.outcome) for f in fence] == [(first, job.id, "created")]


def test_the_listing_counts_runs_and_shows_the_last_status(
    session: Session, runtime: Runtime, settings: Settings, owner: str
) -> None:
    row = save(session, settings, owner, overlap="allow")
    fire(session, runtime, row, T0 + timedelta(hours=1))
    (job,) = fire(session, runtime, row, T0 + timedelta(hours=2)).jobs
    set_status(session, job.id, "running")

    (summary,) = list_schedules(session, owner=owner)

    assert (summary.run_count, summary.last_status) == (2, "running")
    assert summary.schedule.last_fire_at == T0 + timedelta(hours=2)


def test_the_next_fires_are_the_enabled_schedules_soonest_first(
    session: Session, settings: Settings, owner: str
) -> None:
    hourly = save(session, settings, owner, "slow")
    daily = save(session, settings, owner, "dag", every=None, cron="0 9 * * *")
    save(session, settings, owner, "wide", enabled=False)

    assert next_fires(session, owner=owner, limit=5) == [hourly, daily]
    assert next_fires(session, owner=owner, limit=1) == [hourly]
    assert next_fires(session, owner=f"{owner}-other", limit=5) == []


def test_a_stale_scheduler_firing_the_same_fire_again_is_refused_by_the_fence(
    session: Session, runtime: Runtime, settings: Settings, owner: str
) -> None:
    row = save(session, settings, owner, overlap="allow")
    first = T0 + timedelta(hours=1)
    assert len(fire(session, runtime, row, first).jobs) == 1
    row.next_fire_at = first

    assert fire(session, runtime, row, first).jobs == []
    jobs = session.scalar(select(func.count()).where(JobRow.schedule_id == row.id))
    assert jobs == 1


@pytest.mark.parametrize(
    ("overlap", "new_jobs", "outcomes", "previous"),
    [
        ("skip", 0, ["created", "skipped"], "running"),
        ("allow", 1, ["created", "created"], "running"),
        ("cancel_previous", 1, ["created", "created"], "cancelled"),
        ("buffer_one", 0, ["created"], "running"),
    ],
)
def test_overlap_policy_when_the_previous_run_is_still_open(
    session: Session,
    runtime: Runtime,
    settings: Settings,
    owner: str,
    overlap: str,
    new_jobs: int,
    outcomes: list[str],
    previous: str,
) -> None:
    row = save(session, settings, owner, overlap=overlap)
    (first,) = fire(session, runtime, row, T0 + timedelta(hours=1)).jobs
    set_status(session, first.id, "running")

    second = fire(session, runtime, row, T0 + timedelta(hours=2))

    assert len(second.jobs) == new_jobs
    fires = session.scalars(
        select(ScheduleFireRow.outcome)
        .where(ScheduleFireRow.schedule_id == row.id)
        .order_by(ScheduleFireRow.fire_at)
    ).all()
    assert fires == outcomes
    session.expire_all()
    assert session.get(JobRow, first.id).status == previous  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("pipeline", "outcome"), [("search", "deduplicated"), ("search-once", "duplicate")]
)
def test_a_fire_that_duplicates_the_open_run_starts_nothing_and_says_so(
    session: Session, runtime: Runtime, settings: Settings, owner: str, pipeline: str, outcome: str
) -> None:
    row = save(session, settings, owner, pipeline, overlap="allow")
    (first,) = fire(session, runtime, row, T0 + timedelta(hours=1)).jobs

    second = fire(session, runtime, row, T0 + timedelta(hours=2))

    assert second.jobs == []
    fires = session.execute(
        select(ScheduleFireRow.outcome, ScheduleFireRow.job_id)
        .where(ScheduleFireRow.schedule_id == row.id)
        .order_by(ScheduleFireRow.fire_at)
    ).all()
    twin = first.id if outcome == "deduplicated" else None
    assert [tuple(f) for f in fires] == [("created", first.id), (outcome, twin)]
    assert (row.last_job_id, row.run_count) == (first.id, 1)


def test_a_buffered_fire_runs_once_the_previous_run_ends(
    session: Session, runtime: Runtime, settings: Settings, owner: str
) -> None:
    row = save(session, settings, owner, overlap="buffer_one")
    (first,) = fire(session, runtime, row, T0 + timedelta(hours=1)).jobs
    set_status(session, first.id, "running")
    assert fire(session, runtime, row, T0 + timedelta(hours=2)).jobs == []
    assert fire(session, runtime, row, T0 + timedelta(hours=3)).jobs == []
    assert row.buffered_fire_at == T0 + timedelta(hours=2)

    set_status(session, first.id, "succeeded")
    (buffered,) = fire(session, runtime, row, T0 + timedelta(hours=3, minutes=1)).jobs

    assert buffered.scheduled_for == T0 + timedelta(hours=2)
    assert row.buffered_fire_at is None


@pytest.mark.parametrize(
    ("catchup", "expected_hours"), [("none", []), ("latest", [5]), ("all", [3, 4, 5])]
)
def test_fires_missed_while_no_scheduler_ran_are_caught_up_by_policy(
    session: Session,
    runtime: Runtime,
    settings: Settings,
    owner: str,
    catchup: str,
    expected_hours: list[int],
) -> None:
    row = save(session, settings, owner, overlap="allow", catchup=catchup, catchup_window="3h")
    now = T0 + timedelta(hours=5, minutes=30)

    result = fire(session, runtime, row, now)

    assert result.fired == [T0 + timedelta(hours=h) for h in expected_hours]
    assert row.next_fire_at == T0 + timedelta(hours=6)


def test_a_scheduled_run_past_its_timeout_is_cancelled(
    session: Session, runtime: Runtime, settings: Settings, owner: str
) -> None:
    row = save(session, settings, owner)
    (job,) = fire(session, runtime, row, T0 + timedelta(hours=1)).jobs
    session.execute(
        update(JobRow)
        .where(JobRow.id == job.id)
        .values(status="running", started_at=datetime.now(UTC) - timedelta(seconds=400))
    )

    cancel_overdue(session, now=datetime.now(UTC), timeout_s=300)

    session.expire_all()
    cancelled = session.get(JobRow, job.id)
    assert cancelled is not None and cancelled.status == "cancelled"
    assert cancelled.error is not None and cancelled.error["code"] == "run_timeout"


def _extracted(session: Session, job_id: uuid.UUID) -> None:
    """The first step of the shipped etl-saga has succeeded: there is something to undo."""
    walk(session, JobRow, JobRow.id == job_id, to="running")
    extract = (StepRunRow.job_id == job_id, StepRunRow.step_id == "extract")
    walk(session, StepRunRow, *extract, to="succeeded")
    session.execute(update(StepRunRow).where(*extract).values(finished_at=datetime.now(UTC)))


@pytest.mark.parametrize(("pipeline", "undone"), [("etl-saga", True), ("slow", False)])
def test_a_saga_cancelled_by_the_next_fire_is_left_to_compensate_after_the_tick(
    session: Session,
    runtime: Runtime,
    settings: Settings,
    owner: str,
    pipeline: str,
    undone: bool,
) -> None:
    row = save(session, settings, owner, pipeline, overlap="cancel_previous")
    (first,) = fire(session, runtime, row, T0 + timedelta(hours=1)).jobs
    _extracted(session, first.id)

    second = fire(session, runtime, row, T0 + timedelta(hours=2))

    assert second.compensate == ([first.id] if undone else [])


def test_a_saga_past_its_run_timeout_is_left_to_compensate_after_the_tick(
    session: Session, runtime: Runtime, settings: Settings, owner: str
) -> None:
    row = save(session, settings, owner, "etl-saga")
    (job,) = fire(session, runtime, row, T0 + timedelta(hours=1)).jobs
    _extracted(session, job.id)
    session.execute(
        update(JobRow)
        .where(JobRow.id == job.id)
        .values(started_at=datetime.now(UTC) - timedelta(seconds=400))
    )

    overdue = cancel_overdue(session, now=datetime.now(UTC), timeout_s=300)

    assert job.id in overdue.compensate


def test_only_the_newest_runs_of_a_pipeline_are_kept(
    session: Session, runtime: Runtime, settings: Settings, owner: str
) -> None:
    row = save(session, settings, owner, overlap="allow")
    jobs = [fire(session, runtime, row, T0 + timedelta(hours=h)).jobs[0] for h in range(1, 6)]
    for job in jobs[:-1]:
        set_status(session, job.id, "succeeded")
        session.execute(
            update(JobRow).where(JobRow.id == job.id).values(finished_at=job.scheduled_for)
        )
    policy = RetentionPolicy(keep=1, min_age_s=3600)

    assert prune_runs(session, datetime.now(UTC), policy, owner=owner, pipeline="slow") == 3

    left = session.scalars(select(JobRow.id).where(JobRow.owner == owner)).all()
    assert set(left) == {jobs[3].id, jobs[4].id}
    fences = session.scalar(select(func.count()).where(ScheduleFireRow.schedule_id == row.id))
    assert fences == 5


def test_old_fire_records_are_pruned_and_the_run_count_stays(
    session: Session, runtime: Runtime, settings: Settings, owner: str
) -> None:
    row = save(session, settings, owner, overlap="allow")
    for hours in (1, 2, 3):
        fire(session, runtime, row, T0 + timedelta(hours=hours))
    later = T0 + timedelta(hours=2, seconds=FIRE_RECORDS_KEPT_S + row.catchup_window_s + 1)

    pruned = prune_fires(session, later)

    fires = session.scalars(
        select(ScheduleFireRow.fire_at).where(ScheduleFireRow.schedule_id == row.id)
    ).all()
    assert pruned >= 2
    assert fires == [T0 + timedelta(hours=3)]
    [summary] = summarize(session, [row])
    assert summary.run_count == 3


def test_two_schedules_of_one_pipeline_fire_independently_with_their_own_params_and_priority(
    session: Session, runtime: Runtime, settings: Settings, owner: str
) -> None:
    hourly = add(
        session, settings, owner, name="hourly", params={"hold_s": 1}, priority=7, overlap="allow"
    )
    daily = add(session, settings, owner, name="daily", every="1d", params={"hold_s": 2})
    midnight = datetime(2026, 1, 2, tzinfo=UTC)
    assert (hourly.next_fire_at, daily.next_fire_at) == (T0 + timedelta(hours=1), midnight)

    (early,) = fire(session, runtime, hourly, T0 + timedelta(hours=1)).jobs
    assert fire(session, runtime, daily, T0 + timedelta(hours=1)).jobs == []
    hourly.next_fire_at = midnight
    (at_midnight,) = fire(session, runtime, hourly, midnight).jobs
    (from_daily,) = fire(session, runtime, daily, midnight).jobs

    assert [(j.schedule_id, j.params["hold_s"], j.priority) for j in (at_midnight, from_daily)] == [
        (hourly.id, 1, 7),
        (daily.id, 2, 0),
    ]
    assert early.priority == 7
    fences = session.execute(
        select(ScheduleFireRow.schedule_id, ScheduleFireRow.job_id).where(
            ScheduleFireRow.fire_at == midnight
        )
    )
    assert set(fences) == {(hourly.id, at_midnight.id), (daily.id, from_daily.id)}
    assert (hourly.run_count, daily.run_count) == (2, 1)


def test_a_schedule_name_is_unique_per_owner_and_pipeline_and_never_reads_as_an_id(
    session: Session, settings: Settings, owner: str
) -> None:
    add(session, settings, owner, name="daily", enabled=False)
    with pytest.raises(ScheduleNameTaken) as taken:
        add(session, settings, owner, name="daily", enabled=False)
    assert taken.value.details["name"] == "daily"
    add(session, settings, owner, "dag", name="daily", enabled=False)
    add(session, settings, f"{owner}-other", name="daily", enabled=False)
    add(session, settings, owner, enabled=False)
    add(session, settings, owner, enabled=False)
    with pytest.raises(ValueError, match="uuid"):
        ScheduleSpec(every="1h", name=str(uuid.uuid4()))

    assert schedules_of(session, owner) == 4


def test_renaming_to_a_taken_name_is_refused_and_leaving_the_name_out_keeps_it(
    session: Session, settings: Settings, owner: str
) -> None:
    add(session, settings, owner, name="daily", enabled=False)
    monthly = add(session, settings, owner, name="monthly", enabled=False)
    profile = find_profile(settings.profiles_dir, "slow")

    def update(**spec: Any) -> ScheduleRow:
        body = ScheduleSpec.model_validate({"every": "2h", "enabled": False, **spec})
        row, created = set_schedule(
            session,
            owner=owner,
            profile=profile,
            schedule=str(monthly.id),
            spec=body,
            settings=settings,
            now=T0,
        )
        assert not created
        return row

    with pytest.raises(ScheduleNameTaken):
        update(name="daily")
    assert (update().name, update().every_s) == ("monthly", 7200)
    assert update(name="quarterly").name == "quarterly"


def test_each_schedule_counts_against_the_owner_limit_of_enabled_schedules(
    session: Session, settings: Settings, owner: str
) -> None:
    add(session, settings, owner, name="one")
    add(session, settings, owner, name="two")
    with pytest.raises(ScheduleLimitReached):
        add(session, settings, owner, name="three")
    paused = add(session, settings, owner, name="three", enabled=False)
    with pytest.raises(ScheduleLimitReached):
        set_schedule_enabled(
            session,
            owner=owner,
            pipeline="slow",
            schedule="three",
            enabled=True,
            settings=settings,
            now=T0,
        )
    assert paused.enabled is False


def test_the_one_schedule_functions_mean_the_only_schedule_and_refuse_several(
    session: Session, settings: Settings, owner: str
) -> None:
    only = save(session, settings, owner, params={"hold_s": 1})
    assert save(session, settings, owner, params={"hold_s": 2}).id == only.id
    assert get_schedule(session, owner=owner, pipeline="slow").params == {"hold_s": 2}

    second = add(session, settings, owner, name="nightly", every="1d")

    with pytest.raises(ScheduleAmbiguous) as ambiguous:
        get_schedule(session, owner=owner, pipeline="slow")
    assert ambiguous.value.details["schedules"] == [
        {"id": str(only.id), "name": None},
        {"id": str(second.id), "name": "nightly"},
    ]
    with pytest.raises(ScheduleAmbiguous):
        save(session, settings, owner, params={"hold_s": 3})
    with pytest.raises(ScheduleAmbiguous):
        delete_schedule(session, owner=owner, pipeline="slow")
    assert get_schedule(session, owner=owner, pipeline="slow", schedule="nightly").id == second.id
    assert get_schedule(session, owner=owner, pipeline="slow", schedule=str(only.id)) is only
    with pytest.raises(ScheduleNotFound):
        get_schedule(session, owner=owner, pipeline="slow", schedule="monthly")

    delete_schedule(session, owner=owner, pipeline="slow", schedule=str(only.id))

    assert get_schedule(session, owner=owner, pipeline="slow").id == second.id
    assert [s.schedule.name for s in list_schedules(session, owner=owner, pipeline="slow")] == [
        "nightly"
    ]


def test_setting_a_schedule_by_a_new_name_creates_it_and_by_an_unknown_id_is_refused(
    session: Session, settings: Settings, owner: str
) -> None:
    profile = find_profile(settings.profiles_dir, "slow")

    def put(schedule: str, **spec: Any) -> tuple[ScheduleRow, bool]:
        body = ScheduleSpec.model_validate({"every": "1d", "enabled": False, **spec})
        return set_schedule(
            session,
            owner=owner,
            profile=profile,
            schedule=schedule,
            spec=body,
            settings=settings,
            now=T0,
        )

    monthly, created = put("monthly")
    again, created_again = put("monthly", every="2d")
    assert (created, created_again, again.id, again.every_s) == (True, False, monthly.id, 172800)
    with pytest.raises(ScheduleNameMismatch):
        put("weekly", name="daily")
    with pytest.raises(ScheduleNotFound):
        put(str(uuid.uuid4()))
    assert schedules_of(session, owner) == 1


def test_a_schedule_saved_again_from_its_own_spec_is_unchanged(
    session: Session, settings: Settings, owner: str
) -> None:
    row = add(
        session,
        settings,
        owner,
        name="nightly",
        every=None,
        cron="30 2 * * *",
        timezone="Europe/Paris",
        params={"hold_s": 1},
        overlap="buffer_one",
        catchup="all",
        catchup_window="6h",
        jitter="2m",
        diff_mode=True,
        priority=4,
    )
    columns = [column.key for column in ScheduleRow.__table__.columns]
    before = {column: getattr(row, column) for column in columns}

    put_schedule(
        session,
        owner=owner,
        profile=find_profile(settings.profiles_dir, "slow"),
        spec=spec_of(row),
        settings=settings,
        now=T0 + timedelta(minutes=5),
    )

    after = {column: getattr(row, column) for column in columns}
    assert {k: v for k, v in after.items() if before[k] != v} == {
        "updated_at": T0 + timedelta(minutes=5)
    }


def test_a_schedule_labels_the_jobs_it_fires_with_labels_that_may_read_its_params(
    session: Session, runtime: Runtime, settings: Settings, owner: str
) -> None:
    labels = {"tenant": "acme", "hold": "${{ params.hold_s }}"}
    row = save(session, settings, owner, params={"hold_s": 2}, labels=labels)

    (job,) = fire(session, runtime, row, T0 + timedelta(hours=1, seconds=1)).jobs

    assert job.labels == {"tenant": "acme", "hold": "2"}
    assert spec_of(row).labels == labels


def test_a_schedule_label_that_reads_more_than_params_is_refused() -> None:
    with pytest.raises(ValueError, match="params"):
        ScheduleSpec.model_validate({"every": "1h", "labels": {"x": "${{ steps.a.output }}"}})
