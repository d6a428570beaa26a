"""``service.platform.audit``: an event lives and dies with its change's transaction; a job's
``job.submit`` is written by the statement that stores the job, alone or in a batch; details
stay small; the sweeper's pruning deletes by age, a batch at a time, under its lock."""

import uuid
from datetime import timedelta

import pytest
from sqlalchemy import delete, func, select, text

from service.engine.runtime import Runtime
from service.engine.submission import JobRequest, submit_job
from service.platform.audit import Actor, Target, prune_events, record, saved_event, small
from service.platform.clock import utcnow
from service.platform.constants import AUDIT_DETAIL_MAX_BYTES, SWEEP_ADVISORY_LOCK_ID
from service.platform.db import autocommit, unit_of_work
from service.platform.models import AuditEventRow
from tests.service.engine.test_jobs import PROFILES, slow_jobs, store_together


def _actor(owner: str, channel: str = "api") -> Actor:
    return Actor(channel, "POST /v1/jobs", "prefix01", owner)  # type: ignore[arg-type]


def trail(rt: Runtime, owner: str) -> list[tuple[str, str, str]]:
    with rt.sessions() as session:
        rows = session.scalars(
            select(AuditEventRow).where(AuditEventRow.owner == owner).order_by(AuditEventRow.id)
        )
        return [(row.channel, row.action, row.target_id) for row in rows]


def test_an_event_is_rolled_back_with_its_change(runtime: Runtime) -> None:
    owner = f"o-{uuid.uuid4().hex[:8]}"
    with pytest.raises(RuntimeError), unit_of_work(runtime.sessions) as session:
        record(session, _actor(owner), "job.cancel", Target("job", "x"))
        raise RuntimeError("the change is refused after it was recorded")
    with unit_of_work(runtime.sessions) as session:
        record(session, _actor(owner, "cli"), "job.cancel", Target("job", "y"))

    assert trail(runtime, owner) == [("cli", "job.cancel", "y")]


def test_a_submission_writes_its_event_in_the_job_s_own_statement(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    """Autocommitted, as the API submits: each statement commits on its own, so an event
    that came in a second statement would be visible without the job, or missing."""
    owner = f"o-{uuid.uuid4().hex[:8]}"
    jobs = []
    for audit in (_actor(owner), None):
        with runtime.sessions() as session:
            autocommit(session)
            job, _ = submit_job(
                session,
                JobRequest("slow", {}),
                owner=owner,
                profiles_dir=PROFILES,
                known_actions=runtime.registry.names(),
                audit=audit,
            )
            session.commit()
            jobs.append(job.id)
    leftovers.extend(jobs)

    assert trail(runtime, owner) == [("api", "job.submit", str(jobs[0]))]
    with runtime.sessions() as session:
        event = session.scalars(select(AuditEventRow).where(AuditEventRow.owner == owner)).one()
        assert event.detail == {"pipeline": "slow"}
        assert (event.source, event.actor) == ("POST /v1/jobs", "prefix01")


def test_jobs_stored_together_record_the_events_of_the_audited_ones_stored(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    owner = f"o-{uuid.uuid4().hex[:8]}"
    jobs = slow_jobs(runtime, owner, [None, None, None, "k", "k"])
    batch = [
        type(job)(job.values, job.steps, job.name, None if n == 1 else _actor(owner))
        for n, job in enumerate(jobs)
    ]
    leftovers.extend(job.id for job in jobs)

    stored = store_together(runtime, batch, open_jobs_limit=3)

    # The cap of 3 leaves out the fourth; the fifth replays the fourth's key; the second is
    # not audited (a trigger's): two events, one per audited job stored.
    assert stored == {jobs[0].id, jobs[1].id, jobs[2].id}
    assert trail(runtime, owner) == [
        ("api", "job.submit", str(jobs[0].id)),
        ("api", "job.submit", str(jobs[2].id)),
    ]


def test_an_import_names_its_url_without_credentials_or_query() -> None:
    url = "https://me:pw@lab.example.org/p.yaml?token=s3cret#x"
    target, detail = saved_event("p", "o", 2, url)
    assert (target, detail["source"]) == (Target("pipeline", "p"), "https://lab.example.org/p.yaml")


def test_a_large_detail_is_replaced_by_a_note_of_its_size() -> None:
    assert small({"grantee": "student"}) == {"grantee": "student"}
    noted = small({"blob": "x" * AUDIT_DETAIL_MAX_BYTES})
    assert list(noted) == ["omitted"] and "bytes" in noted["omitted"]


def _aged(rt: Runtime, owner: str, days: list[float]) -> None:
    now = utcnow()
    with unit_of_work(rt.sessions) as session:
        for n, age in enumerate(days):
            at = now - timedelta(days=age)
            record(session, _actor(owner, "cli"), "key.revoke", Target("key", f"k{n}"), at=at)


def _oldest_first(rt: Runtime, owner: str) -> list[str]:
    return [target for _, _, target in trail(rt, owner)]


def test_pruning_deletes_what_is_older_than_the_retention_a_batch_at_a_time(
    runtime: Runtime,
) -> None:
    owner = f"o-{uuid.uuid4().hex[:8]}"
    _aged(runtime, owner, [400, 300, 200, 10, 0])
    with unit_of_work(runtime.sessions) as session:
        session.execute(
            delete(AuditEventRow).where(
                AuditEventRow.at < utcnow() - timedelta(days=30), AuditEventRow.owner != owner
            )
        )

    passes = []
    for _ in range(3):
        with unit_of_work(runtime.sessions) as session:
            passes.append(prune_events(session, utcnow(), 30, batch=2))

    assert passes == [2, 1, 0]
    assert _oldest_first(runtime, owner) == ["k3", "k4"]


def test_pruning_leaves_the_rows_to_a_sweep_that_holds_the_lock(runtime: Runtime) -> None:
    owner = f"o-{uuid.uuid4().hex[:8]}"
    _aged(runtime, owner, [400])
    with runtime.sessions() as holder:
        holder.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": SWEEP_ADVISORY_LOCK_ID})
        with unit_of_work(runtime.sessions) as session:
            assert prune_events(session, utcnow(), 30) == 0
        holder.rollback()

    with runtime.sessions() as session:
        assert session.scalar(select(func.count()).where(AuditEventRow.owner == owner)) == 1
