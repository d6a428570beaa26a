"""The home page's job figures: jobs counted by the interval they were submitted in and their
status now, exactly, with the window's edges where the job list would put them."""

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session

from service.engine.overview import (
    Bucket,
    PipelineFailures,
    Span,
    Window,
    failing_pipelines,
    open_jobs,
    running_under,
    slowest_pipelines,
    throughput,
)
from service.engine.runtime import Runtime
from service.platform.models import JobRow, StepRunRow
from tests.support.arrange import add_job, walk

NOW = datetime(2026, 11, 29, 10, 30, 20, tzinfo=UTC)


@pytest.fixture
def session(runtime: Runtime) -> Iterator[Session]:
    """Rows added here are never committed."""
    with runtime.sessions() as open_session:
        yield open_session
        open_session.rollback()


@pytest.fixture
def owner() -> str:
    return f"o-{uuid.uuid4().hex[:8]}"


def _job(
    session: Session,
    owner: str,
    created: datetime,
    status: str,
    *,
    pipeline: str = "p",
    took_s: float | None = None,
) -> uuid.UUID:
    job_id = add_job(session, owner, status, pipeline=pipeline)
    started = created + timedelta(seconds=1) if took_s is not None else None
    finished = started + timedelta(seconds=took_s) if started and took_s is not None else None
    session.execute(
        update(JobRow)
        .where(JobRow.id == job_id)
        .values(created_at=created, started_at=started, finished_at=finished)
    )
    return job_id


def _at(hour: int, minute: int, second: int = 0) -> datetime:
    return NOW.replace(hour=hour, minute=minute, second=second)


def test_the_last_hour_is_sixty_whole_minutes_ending_with_the_current_one() -> None:
    window = Window.ending(Span.HOUR, NOW)

    assert (window.since, window.until) == (_at(9, 31), _at(10, 31))
    assert len(window.starts()) == 60
    assert window.starts()[-1] == _at(10, 30)


def test_the_last_day_is_ninety_six_quarter_hours_ending_with_the_current_one() -> None:
    window = Window.ending(Span.DAY, NOW)

    assert (window.since, window.until) == (_at(10, 45) - timedelta(days=1), _at(10, 45))
    assert len(window.starts()) == 96
    assert window.starts()[-1] == _at(10, 30)


def test_each_minute_counts_the_jobs_submitted_in_it_by_their_status_now(
    session: Session, owner: str
) -> None:
    _job(session, owner, _at(10, 30, 5), "succeeded")
    _job(session, owner, _at(10, 30, 59), "failed")
    _job(session, owner, _at(10, 29), "running")
    _job(session, owner, _at(10, 29, 30), "cancelled")
    _job(session, owner, _at(9, 31), "succeeded")
    _job(session, owner, _at(9, 30, 59), "failed")
    _job(session, owner, _at(10, 31), "queued")
    _job(session, f"{owner}-other", _at(10, 30), "failed")

    buckets = throughput(session, Window.ending(Span.HOUR, NOW), owner=owner)

    assert len(buckets) == 60
    assert buckets[0] == Bucket(_at(9, 31), 1, 1, 0)
    assert buckets[-2] == Bucket(_at(10, 29), 2, 0, 0)
    assert buckets[-1] == Bucket(_at(10, 30), 2, 1, 1)
    assert all(b == Bucket(b.at, 0, 0, 0) for b in buckets[1:-2])


def test_a_quarter_hour_of_the_day_sums_its_minutes(session: Session, owner: str) -> None:
    for minute in (15, 20, 29):
        _job(session, owner, _at(10, minute), "failed")
    _job(session, owner, _at(10, 14, 59), "succeeded")

    buckets = throughput(session, Window.ending(Span.DAY, NOW), owner=owner)

    assert buckets[-2] == Bucket(_at(10, 15), 3, 0, 3)
    assert buckets[-3] == Bucket(_at(10, 0), 1, 1, 0)
    assert sum(b.started for b in buckets) == 4


def test_the_slowest_pipelines_rank_by_the_95th_percentile_of_their_successes(
    session: Session, owner: str
) -> None:
    for took in (1.0, 2.0, 10.0):
        _job(session, owner, _at(10, 0), "succeeded", pipeline="spiky", took_s=took)
    _job(session, owner, _at(10, 0), "succeeded", pipeline="steady", took_s=5.0)
    _job(session, owner, _at(10, 0), "failed", pipeline="broken", took_s=100.0)
    _job(session, owner, _at(9, 0), "succeeded", pipeline="earlier", took_s=100.0)

    slowest = slowest_pipelines(session, Window.ending(Span.HOUR, NOW), owner=owner)

    assert [(p.pipeline, p.runs, p.p50_s, p.p95_s, p.max_s) for p in slowest] == [
        ("spiky", 3, 2.0, 9.2, 10.0),
        ("steady", 1, 5.0, 5.0, 5.0),
    ]


def test_the_most_failing_pipelines_count_failures_among_all_their_jobs(
    session: Session, owner: str
) -> None:
    for status in ("failed", "failed", "succeeded"):
        _job(session, owner, _at(10, 0), status, pipeline="flaky")
    _job(session, owner, _at(10, 0), "failed", pipeline="down")
    _job(session, owner, _at(10, 0), "succeeded", pipeline="fine")
    _job(session, owner, _at(9, 0), "failed", pipeline="earlier")

    failing = failing_pipelines(session, Window.ending(Span.HOUR, NOW), owner=owner)

    assert failing == [PipelineFailures("flaky", 2, 3), PipelineFailures("down", 1, 1)]


def test_open_jobs_count_every_open_job_however_old(session: Session, owner: str) -> None:
    _job(session, owner, NOW - timedelta(days=30), "queued")
    _job(session, owner, _at(10, 0), "running")
    _job(session, owner, _at(10, 0), "running")
    _job(session, owner, _at(10, 0), "succeeded")

    assert open_jobs(session, owner=owner) == {
        "awaiting_approval": 0,
        "queued": 1,
        "running": 2,
    }


def _step(session: Session, job_id: uuid.UUID, step_id: str, task_id: str, status: str) -> None:
    session.add(StepRunRow(job_id=job_id, step_id=step_id, shard=-1, status="pending"))
    session.flush()
    where = (StepRunRow.job_id == job_id, StepRunRow.step_id == step_id)
    walk(session, StepRunRow, *where, to=status)
    session.execute(update(StepRunRow).where(*where).values(task_id=task_id))


def test_the_steps_running_under_a_message_include_its_chains_later_steps(
    session: Session, owner: str
) -> None:
    job, other = _job(session, owner, NOW, "running"), _job(session, owner, NOW, "running")
    _step(session, job, "fetch", "t1", "succeeded")
    _step(session, job, "parse", "t1", "running")
    _step(session, job, "store", "t2", "running")
    _step(session, other, "fetch", "t3", "running")

    running = running_under(session, [(job, "t1"), (job, "t2"), (other, "t9")])

    assert running == {"t1": ["parse"], "t2": ["store"]}
    assert running_under(session, []) == {}
