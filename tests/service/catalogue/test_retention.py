"""Retention: every pipeline keeps its newest finished runs, however its jobs were started."""

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from service.catalogue.diffs import DiffCounts, DiffKind, diff_counts, diff_page
from service.catalogue.retention import RetentionPolicy, prune_all, prune_tombstones
from service.engine.jobs import get_job
from service.engine.runtime import Runtime
from service.engine.steplogs import Said, write_lines
from service.engine.steps import StepKey
from service.engine.submission import JobRequest, submit_job
from service.platform.capture import Line
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from service.platform.errors import JobExpired, JobNotFound
from service.platform.models import JobEventRow, JobRow, PrunedJobRow, StepLogRow, StepRunRow
from service.platform.settings import Settings
from service.platform.states import JOB_FINAL
from tests.conftest import Stack
from tests.support.arrange import walk
from tests.support.runs import run_items
from tests.support.scans import sequential_scans
from tests.support.servers import private_database


@pytest.fixture(scope="module")
def runtime(stack: Stack) -> Iterator[Runtime]:
    """A database of its own: a pass prunes every owner's runs, other tests' included."""
    with private_database("flowbeat_retention") as url:
        rt = Runtime.start(Settings(database_url=url, broker_url=stack.broker_url))
        yield rt
        rt.sessions.kw["bind"].dispose()


ONE_STEP: dict[str, Any] = {"name": "kept", "steps": [{"id": "a", "action": "noop"}]}
NOW = utcnow()
T0 = NOW - timedelta(days=30)
COUNT_ONLY = RetentionPolicy(keep=2, min_age_s=0)
NAMING_TABLES = ("schedule_fires", "hook_deliveries", "dependency_fires")


def _submit(rt: Runtime, session: Session, owner: str, pipeline: str) -> uuid.UUID:
    job, _ = submit_job(
        session,
        JobRequest(pipeline={**ONE_STEP, "name": pipeline}, params={}),
        owner=owner,
        profiles_dir=rt.settings.profiles_dir,
        known_actions=rt.registry.names(),
    )
    return job.id


def _jobs(
    rt: Runtime, owner: str, pipeline: str, statuses: list[str], *, start: datetime = T0
) -> list[uuid.UUID]:
    """Jobs created an hour apart from ``start``, oldest first, with the given statuses; a
    finished one finished a minute after it was created."""
    ids = []
    with unit_of_work(rt.sessions) as session:
        for n, status in enumerate(statuses):
            job_id = _submit(rt, session, owner, pipeline)
            created = start + timedelta(hours=n)
            finished = created + timedelta(minutes=1) if status in JOB_FINAL else None
            walk(session, JobRow, JobRow.id == job_id, to=status)
            session.execute(
                update(JobRow)
                .where(JobRow.id == job_id)
                .values(created_at=created, finished_at=finished)
            )
            ids.append(job_id)
    return ids


def _left(rt: Runtime, ids: list[uuid.UUID]) -> list[uuid.UUID]:
    with unit_of_work(rt.sessions) as session:
        found = set(session.scalars(select(JobRow.id).where(JobRow.id.in_(ids))))
    return [job_id for job_id in ids if job_id in found]


def _prune(rt: Runtime, policy: RetentionPolicy, *, now: datetime = NOW, batch: int = 1000) -> int:
    with unit_of_work(rt.sessions) as session:
        return prune_all(session, now, policy, batch=batch)


def _age(rt: Runtime, ids: list[uuid.UUID], created: datetime) -> None:
    """Moves runs back in time, their order kept, as if they had run from ``created`` on."""
    with unit_of_work(rt.sessions) as session:
        for n, job_id in enumerate(ids):
            at = created + timedelta(hours=n)
            session.execute(
                update(JobRow)
                .where(JobRow.id == job_id)
                .values(created_at=at, started_at=at, finished_at=at + timedelta(minutes=1))
            )


def test_each_pipeline_of_each_owner_keeps_its_newest_finished_runs(runtime: Runtime) -> None:
    me, you = f"me-{uuid.uuid4().hex[:6]}", f"you-{uuid.uuid4().hex[:6]}"
    mine = _jobs(runtime, me, "kept", ["succeeded", "failed", "succeeded", "cancelled"])
    other = _jobs(runtime, me, "other", ["succeeded", "succeeded"])
    yours = _jobs(runtime, you, "kept", ["succeeded", "succeeded", "succeeded"])

    _prune(runtime, COUNT_ONLY)

    assert _left(runtime, mine) == mine[2:]
    assert _left(runtime, other) == other
    assert _left(runtime, yours) == yours[1:]


def test_open_jobs_are_never_pruned_and_do_not_count_as_kept_runs(runtime: Runtime) -> None:
    owner = f"open-{uuid.uuid4().hex[:6]}"
    ids = _jobs(runtime, owner, "kept", ["queued", "succeeded", "succeeded", "running"])

    _prune(runtime, RetentionPolicy(keep=1, min_age_s=0, max_age_days=1))

    assert _left(runtime, ids) == [ids[0], ids[2], ids[3]]


def test_a_pruned_job_takes_its_steps_event_log_and_step_logs_along_and_leaves_a_tombstone(
    runtime: Runtime,
) -> None:
    owner = f"gone-{uuid.uuid4().hex[:6]}"
    old, new = _jobs(runtime, owner, "kept", ["failed", "succeeded"])
    said = [Line(1, "INFO", "stdout", NOW.timestamp(), "what the step said")]
    with runtime.checkpoints.connect() as conn:
        write_lines(conn, [Said(StepKey(old, "a"), 1, said)])

    _prune(runtime, RetentionPolicy(keep=1, min_age_s=0))

    with unit_of_work(runtime.sessions) as session:
        steps = session.scalar(select(func.count()).where(StepRunRow.job_id == old))
        events = session.scalar(select(func.count()).where(JobEventRow.job_id == old))
        lines = session.scalar(select(func.count()).where(StepLogRow.job_id == old))
        kept = session.scalar(select(func.count()).where(JobEventRow.job_id == new))
        tombstone = session.get(PrunedJobRow, old)
        assert tombstone is not None
        assert (tombstone.owner, tombstone.pipeline) == (owner, "kept")
        assert tombstone.finished_at == T0 + timedelta(minutes=1)
        assert tombstone.pruned_at == NOW
        with pytest.raises(JobExpired) as expired:
            get_job(session, old, owner=owner)
        with pytest.raises(JobNotFound):
            get_job(session, old, owner="someone-else")

    assert (steps, events, lines) == (0, 0, 0)
    assert kept
    assert expired.value.details["pruned_at"] == NOW.isoformat()
    assert expired.value.details["finished_at"] == (T0 + timedelta(minutes=1)).isoformat()


def test_a_pruned_job_is_cleared_from_the_rows_that_name_it_through_their_indexes(
    runtime: Runtime,
) -> None:
    """The fires and deliveries that started a job keep their row when it goes, their foreign
    key set to null: found by an index, since a pass of a thousand jobs that read those tables
    whole for each would grow with every schedule's history. Sequential scans are priced out
    here, so one that happens has no index to take instead."""
    old = _jobs(runtime, f"o-{uuid.uuid4().hex[:6]}", "p", ["succeeded"] * 3)

    with (
        unit_of_work(runtime.sessions) as session,
        sequential_scans(session, *NAMING_TABLES) as taken,
    ):
        prune_all(session, NOW, RetentionPolicy(keep=1, min_age_s=0))
        scans = taken()

    assert _left(runtime, old) == old[-1:]
    assert scans == 0


def test_a_pass_deletes_at_most_its_batch(runtime: Runtime) -> None:
    owner = f"batch-{uuid.uuid4().hex[:6]}"
    ids = _jobs(runtime, owner, "kept", ["failed"] * 5)

    _prune(runtime, RetentionPolicy(keep=1, min_age_s=0), batch=2)

    assert _left(runtime, ids) == ids[2:]


def test_a_job_younger_than_the_minimum_age_is_kept_whatever_the_count(runtime: Runtime) -> None:
    owner = f"young-{uuid.uuid4().hex[:6]}"
    ids = _jobs(runtime, owner, "kept", ["failed"] * 5, start=NOW - timedelta(hours=5))

    _prune(runtime, RetentionPolicy(keep=1, min_age_s=6 * 3600))
    assert _left(runtime, ids) == ids

    _prune(runtime, RetentionPolicy(keep=1, min_age_s=3600))
    assert _left(runtime, ids) == ids[4:], "the young run counts as the one kept"


def test_runs_older_than_the_maximum_age_go_whatever_the_count(runtime: Runtime) -> None:
    owner = f"aged-{uuid.uuid4().hex[:6]}"
    old = _jobs(runtime, owner, "kept", ["succeeded", "failed", "succeeded", "failed"])
    recent = _jobs(runtime, owner, "kept", ["failed", "failed"], start=NOW - timedelta(days=2))

    _prune(runtime, RetentionPolicy(keep=100, min_age_s=3600, max_age_days=7))

    assert _left(runtime, old) == [old[2]], "the newest success stays, as the next run's base"
    assert _left(runtime, recent) == recent


def test_the_maximum_age_never_cuts_into_the_minimum_age(runtime: Runtime) -> None:
    owner = f"floor-{uuid.uuid4().hex[:6]}"
    ids = _jobs(runtime, owner, "kept", ["failed"] * 2, start=NOW - timedelta(hours=3))

    _prune(runtime, RetentionPolicy(keep=0, min_age_s=86_400, max_age_days=0.01))

    assert _left(runtime, ids) == ids


def test_tombstones_are_pruned_after_the_maximum_age_or_thirty_days(runtime: Runtime) -> None:
    owner = f"tomb-{uuid.uuid4().hex[:6]}"
    ids = _jobs(runtime, owner, "kept", ["failed", "failed", "failed"])
    _prune(runtime, RetentionPolicy(keep=0, min_age_s=0))

    def tombstones() -> int:
        with unit_of_work(runtime.sessions) as session:
            found = select(func.count()).where(PrunedJobRow.job_id.in_(ids))
            return session.scalar(found) or 0

    def prune(policy: RetentionPolicy, days: float) -> None:
        with unit_of_work(runtime.sessions) as session:
            prune_tombstones(session, NOW + timedelta(days=days), policy)

    no_limit = RetentionPolicy(keep=0, min_age_s=0)
    prune(no_limit, 29)
    assert tombstones() == 3
    prune(RetentionPolicy(keep=0, min_age_s=0, max_age_days=60), 31)
    assert tombstones() == 3
    prune(no_limit, 31)
    assert tombstones() == 0


def _succeeded(rt: Runtime, owner: str, pipeline: str, keys: list[str]) -> uuid.UUID:
    return run_items(rt, [{"id": key} for key in keys], owner=owner, pipeline=pipeline).id


def _diff(rt: Runtime, job_id: uuid.UUID) -> tuple[DiffCounts, uuid.UUID | None, list[str]]:
    with unit_of_work(rt.sessions) as session:
        job = get_job(session, job_id)
        page = diff_page(session, job, DiffKind.REMOVED, limit=10)
        removed = [item["id"] for item in page.items]
        return diff_counts(session, job), job.previous_job_id, removed


def test_a_diff_still_works_after_pruning_its_base_is_kept_not_the_chain(
    runtime: Runtime,
) -> None:
    owner = f"diff-{uuid.uuid4().hex[:6]}"
    first = _succeeded(runtime, owner, "weekly", ["a"])
    base = _succeeded(runtime, owner, "weekly", ["a", "b"])
    latest = _succeeded(runtime, owner, "weekly", ["b", "c"])
    _age(runtime, [first, base, latest], T0)
    before = _diff(runtime, latest)

    _prune(runtime, RetentionPolicy(keep=1, min_age_s=0))

    assert _left(runtime, [first, base, latest]) == [base, latest]
    assert before == _diff(runtime, latest) == (DiffCounts(1, 1, 1), base, ["a"])
    following = _succeeded(runtime, owner, "weekly", ["c", "d"])
    assert _diff(runtime, following) == (DiffCounts(1, 1, 1), latest, ["b"])


def test_the_newest_success_is_kept_when_only_failures_follow(runtime: Runtime) -> None:
    owner = f"fail-{uuid.uuid4().hex[:6]}"
    good = _succeeded(runtime, owner, "weekly", ["a"])
    _age(runtime, [good], T0)
    failures = _jobs(runtime, owner, "weekly", ["failed"] * 3, start=T0 + timedelta(hours=1))

    _prune(runtime, RetentionPolicy(keep=1, min_age_s=0, max_age_days=1))

    assert _left(runtime, [good, *failures]) == [good]
    following = _succeeded(runtime, owner, "weekly", ["a", "b"])
    assert _diff(runtime, following) == (DiffCounts(1, 0, 1), good, [])


def test_the_base_an_open_job_will_diff_against_is_kept(runtime: Runtime) -> None:
    owner = f"opendiff-{uuid.uuid4().hex[:6]}"
    older = _succeeded(runtime, owner, "weekly", ["a"])
    with unit_of_work(runtime.sessions) as session:
        waiting = _submit(runtime, session, owner, "weekly")
    newer = _succeeded(runtime, owner, "weekly", ["b"])
    with unit_of_work(runtime.sessions) as session:
        session.execute(update(JobRow).where(JobRow.id == waiting).values(status="running"))
    _age(runtime, [older, waiting, newer], T0)
    with unit_of_work(runtime.sessions) as session:
        session.execute(update(JobRow).where(JobRow.id == waiting).values(finished_at=None))

    _prune(runtime, RetentionPolicy(keep=0, min_age_s=0, max_age_days=1))

    assert _left(runtime, [older, waiting, newer]) == [older, waiting, newer]
    with unit_of_work(runtime.sessions) as session:
        session.execute(update(JobRow).where(JobRow.id == waiting).values(status="cancelled"))
        session.execute(
            update(JobRow).where(JobRow.id == waiting).values(finished_at=T0 + timedelta(hours=1))
        )
    _prune(runtime, RetentionPolicy(keep=0, min_age_s=0, max_age_days=1))
    assert _left(runtime, [older, waiting, newer]) == [newer]


def test_of_150_runs_the_newest_100_stay_and_all_are_readable_until_the_minimum_age(
    runtime: Runtime,
) -> None:
    owner = f"batch150-{uuid.uuid4().hex[:6]}"
    policy = RetentionPolicy(keep=100, min_age_s=2)
    finished = utcnow()
    with unit_of_work(runtime.sessions) as session:
        ids = [_submit(runtime, session, owner, "many") for _ in range(150)]
        walk(session, JobRow, JobRow.id.in_(ids), to="failed")
        for n, job_id in enumerate(ids):
            created = finished - timedelta(milliseconds=150 - n)
            session.execute(
                update(JobRow)
                .where(JobRow.id == job_id)
                .values(created_at=created, finished_at=finished)
            )
    assert _prune(runtime, policy, now=finished + timedelta(seconds=1)) == 0
    with unit_of_work(runtime.sessions) as session:
        assert all(get_job(session, job_id, owner=owner) for job_id in ids)

    assert _prune(runtime, policy, now=finished + timedelta(seconds=3)) == 50

    assert _left(runtime, ids) == ids[50:]
    with unit_of_work(runtime.sessions) as session:
        for job_id in ids[:50]:
            with pytest.raises(JobExpired):
                get_job(session, job_id, owner=owner)
