"""Dedupe windows: a job whose dedupe key matches an open job, or one that ended within the
window, of the same owner and pipeline is answered with that job or refused, and PostgreSQL
makes racing submissions store one job."""

import asyncio
import threading
import uuid
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, update

from service.engine.intake import insert_jobs_if_resolved, new_job
from service.engine.jobs import cancel_job
from service.engine.runtime import Runtime
from service.engine.submission import JobRequest, Outcome, resolve_request, submit_job
from service.language.checks import validate_profile
from service.platform.clock import utcnow
from service.platform.db import autocommit, connect_kwargs, libpq_url, unit_of_work
from service.platform.errors import DuplicateJob, ProfileInvalid
from service.platform.models import JobRow

RACERS = 6


def _profile(on_duplicate: str = "return", window_s: int = 3600) -> dict[str, Any]:
    return {
        "name": f"dd-{uuid.uuid4().hex[:8]}",
        "params": {"query": {"type": "string", "required": True}},
        "dedupe": {
            "key": "${{ params.query }}",
            "window_s": window_s,
            "on_duplicate": on_duplicate,
        },
        "steps": [{"id": "only", "action": "noop"}],
    }


def _submit(
    rt: Runtime, owner: str, profile: dict[str, Any], query: Any, **options: Any
) -> tuple[JobRow, Outcome]:
    """As the API submits: one autocommitted session, the job committed before it returns."""
    with rt.sessions() as session:
        autocommit(session)
        job, outcome = submit_job(
            session,
            JobRequest(pipeline=profile, params={"query": query}),
            owner=owner,
            profiles_dir=None,
            known_actions=rt.registry.names(),
            **options,
        )
        session.commit()
        return job, outcome


def _owner() -> str:
    return f"o-{uuid.uuid4().hex[:8]}"


def _count(rt: Runtime, owner: str) -> int:
    with rt.sessions() as session:
        return session.scalar(select(func.count()).where(JobRow.owner == owner)) or 0


def _end(rt: Runtime, job_id: uuid.UUID, ago_s: float) -> None:
    """Cancels the job as a person would, then dates its end ``ago_s`` back."""
    with unit_of_work(rt.sessions) as session:
        cancel_job(session, job_id, owner=None, now=utcnow())
    with unit_of_work(rt.sessions) as session:
        ended = utcnow() - timedelta(seconds=ago_s)
        session.execute(update(JobRow).where(JobRow.id == job_id).values(finished_at=ended))


def test_a_duplicate_of_an_open_job_gets_that_job_back_and_stores_nothing(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    owner, profile = _owner(), _profile()
    first, outcome = _submit(runtime, owner, profile, "crispr")
    leftovers.append(first.id)
    again, again_outcome = _submit(runtime, owner, profile, "crispr")

    assert outcome is Outcome.NEW and first.dedupe_key == "crispr"
    assert again_outcome is Outcome.DEDUPLICATED and again.id == first.id
    assert _count(runtime, owner) == 1


def test_another_key_owner_or_pipeline_is_no_duplicate(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    owner, profile = _owner(), _profile()
    other_pipeline = {**profile, "name": f"{profile['name']}-b"}
    jobs = [
        _submit(runtime, owner, profile, "crispr"),
        _submit(runtime, owner, profile, "prime editing"),
        _submit(runtime, _owner(), profile, "crispr"),
        _submit(runtime, owner, other_pipeline, "crispr"),
    ]
    leftovers.extend(job.id for job, _ in jobs)

    assert [outcome for _, outcome in jobs] == [Outcome.NEW] * 4


def test_reject_names_the_job_it_duplicates(runtime: Runtime, leftovers: list[uuid.UUID]) -> None:
    owner, profile = _owner(), _profile("reject")
    first, _ = _submit(runtime, owner, profile, "crispr")
    leftovers.append(first.id)

    with pytest.raises(DuplicateJob) as refused:
        _submit(runtime, owner, profile, "crispr")

    assert refused.value.code == "duplicate_job"
    assert refused.value.details["job_id"] == str(first.id)
    assert refused.value.details["dedupe_key"] == "crispr"
    assert str(first.id) in refused.value.message
    assert _count(runtime, owner) == 1


def test_a_job_that_ended_within_the_window_answers_and_one_before_it_does_not(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    owner, profile = _owner(), _profile(window_s=600)
    first, _ = _submit(runtime, owner, profile, "crispr")
    _end(runtime, first.id, ago_s=300)
    within, outcome = _submit(runtime, owner, profile, "crispr")
    assert outcome is Outcome.DEDUPLICATED and within.id == first.id

    with unit_of_work(runtime.sessions) as session:
        ended = utcnow() - timedelta(seconds=900)
        session.execute(update(JobRow).where(JobRow.id == first.id).values(finished_at=ended))
    after, outcome = _submit(runtime, owner, profile, "crispr")
    leftovers.append(after.id)

    assert outcome is Outcome.NEW and after.id != first.id


def test_a_window_of_zero_dedupes_open_jobs_only(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    owner, profile = _owner(), _profile(window_s=0)
    first, _ = _submit(runtime, owner, profile, "crispr")
    assert _submit(runtime, owner, profile, "crispr")[1] is Outcome.DEDUPLICATED
    _end(runtime, first.id, ago_s=1)
    after, outcome = _submit(runtime, owner, profile, "crispr")
    leftovers.append(after.id)

    assert outcome is Outcome.NEW


def test_a_duplicate_is_answered_at_the_open_jobs_limit(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    owner, profile = _owner(), _profile()
    first, _ = _submit(runtime, owner, profile, "crispr")
    leftovers.append(first.id)

    again, outcome = _submit(runtime, owner, profile, "crispr", open_jobs_limit=1)

    assert outcome is Outcome.DEDUPLICATED and again.id == first.id


def test_a_long_or_structured_key_is_stored_as_text_that_fits_its_index(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    owner = _owner()
    profile = _profile()
    profile["params"]["query"] = {"type": "object", "required": True}
    long, _ = _submit(runtime, owner, profile, {"terms": ["x" * 5000], "since": 2020})
    same, outcome = _submit(runtime, owner, profile, {"since": 2020, "terms": ["x" * 5000]})
    leftovers.append(long.id)

    assert long.dedupe_key is not None and long.dedupe_key.startswith("sha256:")
    assert outcome is Outcome.DEDUPLICATED and same.id == long.id


def test_racing_submissions_with_one_key_store_one_job(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    owner, profile = _owner(), _profile()
    start = threading.Barrier(RACERS)
    outcomes: list[tuple[JobRow, Outcome]] = []

    def racer() -> None:
        start.wait()
        outcomes.append(_submit(runtime, owner, profile, "crispr"))

    threads = [threading.Thread(target=racer) for _ in range(RACERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    leftovers.extend(job.id for job, _ in outcomes)

    assert len(outcomes) == RACERS
    assert len({job.id for job, _ in outcomes}) == 1
    assert sorted(outcome for _, outcome in outcomes) == sorted(
        [Outcome.NEW] + [Outcome.DEDUPLICATED] * (RACERS - 1)
    )
    assert _count(runtime, owner) == 1


async def _batch(rt: Runtime, owner: str, profile: dict[str, Any], queries: list[str]) -> int:
    import psycopg

    url = rt.settings.require_database_url()
    with rt.sessions() as session:
        resolved = resolve_request(
            session, profile, owner=owner, profiles_dir=None, known_actions=rt.registry.names()
        )
    jobs = [
        new_job(JobRequest(pipeline=profile, params={"query": q}), resolved, owner=owner, name="x")
        for q in queries
    ]
    async with await psycopg.AsyncConnection.connect(
        libpq_url(url), autocommit=True, **connect_kwargs(url, False)
    ) as conn:
        return len(await insert_jobs_if_resolved(conn, jobs, open_jobs_limit=0))


def test_the_batched_intake_stores_one_job_of_a_key_and_none_of_an_open_one(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    owner, profile = _owner(), _profile()
    _submit(runtime, owner, profile, "open")

    stored = asyncio.run(_batch(runtime, owner, profile, ["open", "new", "new", "other"]))

    with runtime.sessions() as session:
        leftovers.extend(session.scalars(select(JobRow.id).where(JobRow.owner == owner)))
    assert stored == 2
    assert _count(runtime, owner) == 3


def test_an_idempotency_key_past_its_ttl_is_free_again(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    owner, key = _owner(), uuid.uuid4().hex
    profile = {"name": "ttl", "steps": [{"id": "only", "action": "noop"}]}

    def keyed() -> tuple[uuid.UUID, Outcome]:
        with unit_of_work(runtime.sessions) as session:
            job, outcome = submit_job(
                session,
                JobRequest(pipeline=profile, params={}, idempotency_key=key),
                owner=owner,
                profiles_dir=None,
                known_actions=runtime.registry.names(),
                idempotency_ttl_s=60,
            )
            return job.id, outcome

    first, _ = keyed()
    assert keyed() == (first, Outcome.REPLAYED)
    with unit_of_work(runtime.sessions) as session:
        old = utcnow() - timedelta(seconds=61)
        session.execute(update(JobRow).where(JobRow.id == first).values(created_at=old))
    later, outcome = keyed()
    leftovers.extend([first, later])

    assert outcome is Outcome.NEW and later != first
    assert keyed() == (later, Outcome.REPLAYED)
    with runtime.sessions() as session:
        assert session.scalar(select(JobRow.idempotency_key).where(JobRow.id == first)) is None


@pytest.mark.parametrize(
    ("dedupe", "field", "words"),
    [
        ({"key": "${{ steps.a.output }}", "window_s": 60}, "dedupe.key", "steps"),
        ({"key": "${{ params.q }}", "window_s": -1}, "dedupe.window_s", "greater than"),
        ({"key": "${{ params.q }}", "on_duplicate": "merge"}, "dedupe.on_duplicate", "return"),
        ({"window_s": 60}, "dedupe.key", "required"),
        ({"key": "${{ params.nope }}"}, "dedupe.key", "undeclared param 'nope'"),
    ],
)
def test_a_bad_dedupe_is_refused_naming_its_field(
    dedupe: dict[str, Any], field: str, words: str
) -> None:
    profile = {
        "name": "bad",
        "params": {"q": {"type": "string"}},
        "dedupe": dedupe,
        "steps": [{"id": "a", "action": "noop"}],
    }
    with pytest.raises(ProfileInvalid) as refused:
        validate_profile(profile, source="bad.yaml", known_actions={"noop"})
    assert refused.value.message.startswith(f"bad.yaml: field '{field}': ")
    assert words in refused.value.message
