"""A profile is stored once by its content hash, however many jobs run it, and goes once no
job names it; a job being stored keeps the profile it found from being deleted under it."""

import threading
import uuid
from datetime import timedelta
from typing import Any

from sqlalchemy import func, select, update

from service.engine.profiles import UNNAMED_KEPT_S, prune_profiles
from service.engine.runtime import Runtime
from service.engine.submission import JobRequest, submit_job
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from service.platform.models import JobProfileRow, JobRow
from tests.support.fanouts import submitted
from tests.support.locks import wait_for_a_lock_waiter


def _profile() -> dict[str, Any]:
    return {"name": f"once-{uuid.uuid4().hex[:6]}", "steps": [{"id": "a", "action": "noop"}]}


def _stored(rt: Runtime, job_id: uuid.UUID) -> tuple[str, int, dict[str, Any]]:
    with unit_of_work(rt.sessions) as session:
        job = session.get(JobRow, job_id)
        assert job is not None
        copies = session.scalar(select(func.count()).where(JobProfileRow.hash == job.profile_hash))
        return job.profile_hash, copies or 0, job.profile


def _age(rt: Runtime, profile_hash: str) -> None:
    with unit_of_work(rt.sessions) as session:
        session.execute(
            update(JobProfileRow)
            .where(JobProfileRow.hash == profile_hash)
            .values(created_at=utcnow() - timedelta(seconds=UNNAMED_KEPT_S + 60))
        )


def _prune(rt: Runtime) -> None:
    with unit_of_work(rt.sessions) as session:
        prune_profiles(session, utcnow())


def _exists(rt: Runtime, profile_hash: str) -> bool:
    with unit_of_work(rt.sessions) as session:
        return session.get(JobProfileRow, profile_hash) is not None


def test_jobs_of_one_profile_store_it_once_and_each_reads_it(runtime: Runtime) -> None:
    profile = _profile()
    first, second = submitted(runtime, profile, {}), submitted(runtime, profile, {})

    hash_1, copies, stored = _stored(runtime, first)
    hash_2, _, _ = _stored(runtime, second)

    assert hash_1 == hash_2 and copies == 1
    assert stored["name"] == profile["name"]
    assert [step["id"] for step in stored["steps"]] == ["a"]


def test_a_profile_goes_a_day_after_no_job_names_it(runtime: Runtime) -> None:
    named = submitted(runtime, _profile(), {})
    named_hash, _, _ = _stored(runtime, named)
    gone = submitted(runtime, _profile(), {})
    gone_hash, _, _ = _stored(runtime, gone)
    with unit_of_work(runtime.sessions) as session:
        session.delete(session.get(JobRow, gone))
    _prune(runtime)
    assert _exists(runtime, gone_hash), "a profile unnamed for less than a day is kept"

    _age(runtime, gone_hash)
    _age(runtime, named_hash)
    _prune(runtime)

    assert not _exists(runtime, gone_hash)
    assert _exists(runtime, named_hash)


def test_pruning_waits_for_a_job_being_stored_and_then_keeps_its_profile(
    runtime: Runtime,
) -> None:
    """The storing statement found the profile stored, and shares the lock until it commits:
    the pruner, which holds it alone, reads the job once it is committed, and keeps the
    profile it names. Without the lock the pruner would not see the job, and delete it."""
    profile = _profile()
    old = submitted(runtime, profile, {})
    profile_hash, _, _ = _stored(runtime, old)
    with unit_of_work(runtime.sessions) as session:
        session.delete(session.get(JobRow, old))
    _age(runtime, profile_hash)
    storing = runtime.sessions()
    storing.begin()
    job, _ = submit_job(
        storing,
        JobRequest(pipeline=profile, params={}),
        owner="profiles",
        profiles_dir=runtime.settings.profiles_dir,
        known_actions=runtime.registry.names(),
    )
    pruner = threading.Thread(target=_prune, args=(runtime,))
    pruner.start()
    try:
        wait_for_a_lock_waiter(runtime, "the pruner, behind the storing statement,")
    finally:
        storing.commit()
        storing.close()
    pruner.join(timeout=30)

    assert not pruner.is_alive()
    assert _exists(runtime, profile_hash)
    assert _stored(runtime, job.id)[2]["name"] == profile["name"]
