"""Accepting jobs: a job and its steps are stored together; an idempotency key holds one job."""

import asyncio
import threading
import uuid
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import func, select

from service.catalogue.resolution import ResolvedPipeline
from service.engine.intake import NewJob, insert_jobs_if_resolved, new_job, plan_once
from service.engine.runtime import Runtime
from service.engine.submission import JobRequest, Outcome, submit_job
from service.language.loading import find_profile
from service.platform.db import libpq_url, unit_of_work
from service.platform.errors import IdempotencyConflict, OpenJobsLimit
from service.platform.models import JobRow, StepRunRow

PROFILES = Path(__file__).resolve().parents[2] / "profiles"
SUBMITTERS = 6


def submit(
    rt: Runtime, owner: str, request: JobRequest, open_jobs_limit: int = 0
) -> tuple[uuid.UUID, bool]:
    with unit_of_work(rt.sessions) as session:
        job, outcome = submit_job(
            session,
            request,
            owner=owner,
            profiles_dir=PROFILES,
            known_actions=rt.registry.names(),
            open_jobs_limit=open_jobs_limit,
        )
        return job.id, outcome is Outcome.NEW


def stored(rt: Runtime, owner: str) -> tuple[int, int]:
    with rt.sessions() as session:
        jobs = session.scalar(select(func.count()).where(JobRow.owner == owner))
        steps = session.scalar(
            select(func.count())
            .select_from(StepRunRow)
            .join(JobRow, JobRow.id == StepRunRow.job_id)
            .where(JobRow.owner == owner)
        )
    return jobs or 0, steps or 0


def test_a_job_and_all_its_steps_are_stored_together(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    owner = f"o-{uuid.uuid4().hex[:8]}"
    job_id, created = submit(runtime, owner, JobRequest(pipeline="slow", params={}))
    leftovers.append(job_id)

    assert created
    with runtime.sessions() as session:
        steps = session.scalars(
            select(StepRunRow.step_id).where(StepRunRow.job_id == job_id).order_by(StepRunRow.id)
        ).all()
    assert list(steps) == ["before", "slow", "after"]


def test_concurrent_submits_with_one_idempotency_key_store_one_job(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    owner, key = f"o-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    request = JobRequest(pipeline="slow", params={}, idempotency_key=key)
    start = threading.Barrier(SUBMITTERS)
    outcomes: list[tuple[uuid.UUID, bool]] = []

    def racer() -> None:
        start.wait()
        outcomes.append(submit(runtime, owner, request))

    threads = [threading.Thread(target=racer) for _ in range(SUBMITTERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    leftovers.extend(job_id for job_id, _ in outcomes)
    assert len(outcomes) == SUBMITTERS
    assert len({job_id for job_id, _ in outcomes}) == 1
    assert sum(created for _, created in outcomes) == 1
    assert stored(runtime, owner) == (1, 3)


def test_a_reused_key_with_other_params_is_refused_and_stores_nothing(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    owner, key = f"o-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    first, _ = submit(runtime, owner, JobRequest(pipeline="slow", params={}, idempotency_key=key))
    leftovers.append(first)

    with pytest.raises(IdempotencyConflict):
        submit(
            runtime,
            owner,
            JobRequest(pipeline="slow", params={}, idempotency_key=key, diff_mode=True),
        )
    assert stored(runtime, owner) == (1, 3)


def test_a_replayed_key_gets_its_job_at_the_open_jobs_limit_and_a_new_job_does_not(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    owner = f"o-{uuid.uuid4().hex[:8]}"
    first = [
        submit(runtime, owner, JobRequest("slow", {}, idempotency_key=key), open_jobs_limit=2)
        for key in ("k1", "k2")
    ]
    leftovers.extend(job_id for job_id, _ in first)

    replayed = submit(runtime, owner, JobRequest("slow", {}, idempotency_key="k2"), 2)
    assert replayed == (first[1][0], False)
    with pytest.raises(OpenJobsLimit):
        submit(runtime, owner, JobRequest("slow", {}, idempotency_key="k3"), open_jobs_limit=2)
    assert stored(runtime, owner) == (2, 6)


def test_keys_are_per_owner(runtime: Runtime, leftovers: list[uuid.UUID]) -> None:
    key = uuid.uuid4().hex
    first = submit(
        runtime, f"o-{uuid.uuid4().hex[:8]}", JobRequest("slow", {}, idempotency_key=key)
    )
    second = submit(
        runtime, f"o-{uuid.uuid4().hex[:8]}", JobRequest("slow", {}, idempotency_key=key)
    )

    leftovers.extend((first[0], second[0]))
    assert first[1] and second[1]
    assert first[0] != second[0]


def store_together(rt: Runtime, jobs: list[NewJob], open_jobs_limit: int = 0) -> set[uuid.UUID]:
    async def insert() -> set[uuid.UUID]:
        url = libpq_url(rt.settings.require_database_url())
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            return await insert_jobs_if_resolved(conn, jobs, open_jobs_limit=open_jobs_limit)

    return asyncio.run(insert())


def slow_jobs(rt: Runtime, owner: str, keys: list[str | None]) -> list[NewJob]:
    profile = find_profile(PROFILES, "slow", known_actions=rt.registry.names())
    resolved = ResolvedPipeline(profile, None, None)
    return [
        new_job(
            JobRequest(pipeline="slow", params={}, idempotency_key=key),
            resolved,
            owner=owner,
            name="slow",
        )
        for key in keys
    ]


def test_a_connection_planned_once_stores_every_later_batch_on_one_generic_plan(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    owner = f"o-{uuid.uuid4().hex[:8]}"

    async def plans() -> tuple[int, int]:
        url = libpq_url(runtime.settings.require_database_url())
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await plan_once(conn)
            for _ in range(8):
                jobs = slow_jobs(runtime, owner, [None])
                leftovers.extend(job.id for job in jobs)
                assert await insert_jobs_if_resolved(conn, jobs, open_jobs_limit=0)
            cursor = await conn.execute(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                " WHERE statement LIKE '%jsonb_to_recordset%'"
            )
            row = await cursor.fetchone()
            assert row is not None, "the intake statement was never prepared"
            return row[0], row[1]

    generic, custom = asyncio.run(plans())
    assert generic >= 1 and custom == 0
    assert stored(runtime, owner) == (8, 24)


def test_jobs_stored_together_each_get_their_own_steps(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    owner = f"o-{uuid.uuid4().hex[:8]}"
    jobs = slow_jobs(runtime, owner, [None, None, None])
    leftovers.extend(job.id for job in jobs)

    assert store_together(runtime, jobs) == {job.id for job in jobs}
    assert stored(runtime, owner) == (3, 9)


def test_jobs_stored_together_count_each_other_against_the_open_jobs_cap(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    owner = f"o-{uuid.uuid4().hex[:8]}"
    jobs = slow_jobs(runtime, owner, [None, None, None])
    leftovers.extend(job.id for job in jobs)

    assert store_together(runtime, jobs, open_jobs_limit=2) == {jobs[0].id, jobs[1].id}
    assert stored(runtime, owner) == (2, 6)


def test_replays_stored_together_take_no_place_under_the_open_jobs_cap(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    owner = f"o-{uuid.uuid4().hex[:8]}"
    first, _ = submit(runtime, owner, JobRequest("slow", {}, idempotency_key="k1"))
    jobs = slow_jobs(runtime, owner, ["k1", "k2", "k2", None])
    leftovers.extend([first, *(job.id for job in jobs)])

    # One open job and a cap of 3: the replay of k1 and the second k2 are left out (a replay is
    # answered by submit_job), and the two new jobs fit.
    assert store_together(runtime, jobs, open_jobs_limit=3) == {jobs[1].id, jobs[3].id}
    assert stored(runtime, owner) == (3, 9)


def test_jobs_stored_together_hold_one_job_per_idempotency_key(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    owner = f"o-{uuid.uuid4().hex[:8]}"
    jobs = slow_jobs(runtime, owner, ["k", "k", None])
    leftovers.extend(job.id for job in jobs)

    assert store_together(runtime, jobs) == {jobs[0].id, jobs[2].id}
    assert stored(runtime, owner) == (2, 6)


def test_a_job_whose_name_resolves_elsewhere_now_is_left_out_alone(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    owner = f"o-{uuid.uuid4().hex[:8]}"
    jobs = slow_jobs(runtime, owner, [None, None])
    saved_elsewhere = {**jobs[1].values, "pipeline_id": uuid.uuid4(), "pipeline_version": 1}
    stale = NewJob(saved_elsewhere, jobs[1].steps, "slow")
    leftovers.extend(job.id for job in jobs)

    assert store_together(runtime, [jobs[0], stale]) == {jobs[0].id}
    assert stored(runtime, owner) == (1, 3)
