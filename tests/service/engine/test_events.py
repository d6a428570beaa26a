"""The event log: written by the database with each state change, numbered per job in commit
order, and never in disagreement with the rows it describes."""

import threading
import uuid
from typing import Any

import psycopg
import pytest
from sqlalchemy import delete, make_url, select, update

from service.engine.claims import fast_claim
from service.engine.events import (
    Event,
    events_after,
    events_since,
    job_settled,
    notice_events,
    step_history,
)
from service.engine.lanes import run_lane
from service.engine.runner import run_finish_fanout, run_step
from service.engine.runtime import Runtime
from service.engine.steps import StepKey
from service.engine.submission import JobRequest, submit_job
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from service.platform.listener import EventListener
from service.platform.models import JobEventRow, JobRow, StepRunRow
from tests.support.runs import run_items

TWO_STEPS: dict[str, Any] = {
    "name": "two-steps",
    "steps": [
        {"id": "a", "action": "noop"},
        {"id": "b", "action": "noop", "depends_on": ["a"]},
    ],
}


def _submit(rt: Runtime, profile: dict[str, Any], owner: str = "events") -> uuid.UUID:
    with unit_of_work(rt.sessions) as session:
        job, _ = submit_job(
            session,
            JobRequest(pipeline=profile, params={}),
            owner=owner,
            profiles_dir=rt.settings.profiles_dir,
            known_actions=rt.registry.names(),
        )
        return job.id


def _log(rt: Runtime, job_id: uuid.UUID) -> list[Event]:
    with unit_of_work(rt.sessions) as session:
        return events_after(session, job_id, 0)


def _conninfo(rt: Runtime) -> str:
    url = make_url(rt.settings.require_database_url())
    return url.set(drivername="postgresql").render_as_string(False)


def test_a_run_is_logged_change_by_change_numbered_from_one(runtime: Runtime) -> None:
    job_id = _submit(runtime, TWO_STEPS)
    for step in ("a", "b"):
        run_step(runtime, StepKey(job_id, step), task_id=uuid.uuid4().hex)

    log = _log(runtime, job_id)

    assert [e.seq for e in log] == list(range(1, len(log) + 1))
    assert [(e.kind, e.step_id) for e in log] == [
        ("job.queued", None),
        ("step.running", "a"),
        ("job.running", None),
        ("step.succeeded", "a"),
        ("step.running", "b"),
        ("step.succeeded", "b"),
        ("job.succeeded", None),
    ]
    assert log[1].data == {"attempt": 1, "round": 1}


def test_a_statement_logs_all_its_changes_in_one_row(runtime: Runtime) -> None:
    """A claim that starts its job, or a checkpoint that succeeds the job (or claims the next
    step, in a chain run inline), writes one row for its two events (ADR 20): the row states
    its last, ``more`` the ones before, and a reader gets each with its own number."""
    job_id = _submit(runtime, TWO_STEPS)
    for step in ("a", "b"):
        run_step(runtime, StepKey(job_id, step), task_id=uuid.uuid4().hex)

    with unit_of_work(runtime.sessions) as session:
        rows = session.execute(
            select(JobEventRow.seq, JobEventRow.kind, JobEventRow.more)
            .where(JobEventRow.job_id == job_id)
            .order_by(JobEventRow.seq)
        ).all()

    assert [(seq, kind, [m["kind"] for m in more or []]) for seq, kind, more in rows] == [
        (1, "job.queued", []),
        (3, "job.running", ["step.running"]),
        (4, "step.succeeded", []),
        (5, "step.running", []),
        (7, "job.succeeded", ["step.succeeded"]),
    ]


def test_a_reader_resumes_inside_a_row(runtime: Runtime) -> None:
    job_id = _submit(runtime, TWO_STEPS)
    for step in ("a", "b"):
        run_step(runtime, StepKey(job_id, step), task_id=uuid.uuid4().hex)

    with unit_of_work(runtime.sessions) as session:
        after_claim = events_after(session, job_id, 2)
        one = events_after(session, job_id, 3, limit=1)
        steps = step_history(session, job_id, limit=3)

    assert [(e.seq, e.kind) for e in after_claim][:2] == [(3, "job.running"), (4, "step.succeeded")]
    assert [(e.seq, e.kind, e.step_id) for e in one] == [(4, "step.succeeded", "a")]
    assert [(e.seq, e.kind, e.step_id) for e in steps] == [
        (2, "step.running", "a"),
        (4, "step.succeeded", "a"),
        (5, "step.running", "b"),
    ]


def _marks(rt: Runtime, job_id: uuid.UUID) -> dict[str | None, bool]:
    with unit_of_work(rt.sessions) as session:
        job = session.get(JobRow, job_id)
        assert job is not None
        steps = session.execute(
            select(StepRunRow.step_id, StepRunRow.logged_inline).where(StepRunRow.job_id == job_id)
        ).all()
    return {None: job.logged_inline} | {step_id: mark for step_id, mark in steps}


def test_the_claim_and_checkpoint_statements_log_their_own_changes_once(
    runtime: Runtime,
) -> None:
    """The statements of the step path append their events themselves and flip the rows'
    marks (a job stored by such a statement is stored marked), and the log's triggers skip
    those changes: each is logged once, not twice."""
    job_id = _submit(runtime, TWO_STEPS)
    stored = _marks(runtime, job_id)
    with runtime.claims.connect() as conn:
        assert fast_claim(conn, StepKey(job_id, "a"), task_id="t", lease_s=30, now=utcnow())

    assert stored == {None: True, "a": False, "b": False}
    assert _marks(runtime, job_id) == {None: False, "a": True, "b": False}
    assert [(e.seq, e.kind, e.step_id) for e in _log(runtime, job_id)] == [
        (1, "job.queued", None),
        (2, "step.running", "a"),
        (3, "job.running", None),
    ]

    with runtime.sessions() as session:
        session.execute(
            update(StepRunRow)
            .where(StepRunRow.job_id == job_id, StepRunRow.step_id == "b")
            .values(status="skipped")
        )
        session.commit()

    assert _marks(runtime, job_id)["b"] is False
    assert [(e.kind, e.step_id) for e in _log(runtime, job_id)][-1] == ("step.skipped", "b")


def test_the_last_event_of_each_row_states_the_row(runtime: Runtime) -> None:
    job_id = _submit(runtime, TWO_STEPS)
    run_step(runtime, StepKey(job_id, "a"), task_id=uuid.uuid4().hex)

    log = _log(runtime, job_id)
    with unit_of_work(runtime.sessions) as session:
        job = session.get(JobRow, job_id)
        steps = session.execute(
            select(StepRunRow.step_id, StepRunRow.status).where(StepRunRow.job_id == job_id)
        ).all()

    assert job is not None
    last: dict[str | None, str] = {e.step_id: e.kind.split(".", 1)[1] for e in log}
    assert last[None] == job.status
    for step_id, status in steps:
        assert last.get(step_id, "pending") == status


def test_a_change_rolled_back_leaves_no_event(runtime: Runtime) -> None:
    job_id = _submit(runtime, TWO_STEPS)
    with runtime.sessions() as session:
        session.execute(update(JobRow).where(JobRow.id == job_id).values(status="cancelled"))
        session.rollback()

    assert [e.kind for e in _log(runtime, job_id)] == ["job.queued"]


def test_events_are_numbered_in_commit_order_not_in_change_order(runtime: Runtime) -> None:
    """A reader that saw seq n and asks for what follows can never miss a later commit."""
    job_id = _submit(runtime, TWO_STEPS)
    first = psycopg.connect(_conninfo(runtime))
    second = psycopg.connect(_conninfo(runtime))
    try:
        change = "UPDATE step_runs SET status = 'skipped' WHERE job_id = %s AND step_id = %s"
        first.execute(change, (job_id, "a"))
        second.execute(change, (job_id, "b"))
        second.commit()
        first.commit()
    finally:
        first.close()
        second.close()

    kinds = [(e.seq, e.step_id) for e in _log(runtime, job_id) if e.kind == "step.skipped"]
    assert kinds == [(2, "b"), (3, "a")]


def test_fan_out_progress_is_reported_in_batches_not_per_item(runtime: Runtime) -> None:
    job_id = _submit(
        runtime,
        {
            "name": "wide-enough",
            "params": {"n": {"type": "array", "default": list(range(25))}},
            "steps": [
                {
                    "id": "each",
                    "action": "noop",
                    "for_each": {"items": "${{ params.n }}", "max_parallel": 1},
                    "with": {"x": "${{ item }}"},
                }
            ],
        },
    )
    key = StepKey(job_id, "each")
    run_step(runtime, key, task_id=uuid.uuid4().hex)
    while run_lane(runtime, key, task_id=uuid.uuid4().hex, slice_s=0):
        pass
    run_finish_fanout(runtime, key)

    progress = [e.data for e in _log(runtime, job_id) if e.kind == "step.progress"]

    assert len(progress) == 2
    assert [p["total"] for p in progress] == [25, 25]
    assert [p["done"] for p in progress] == [10, 20]
    assert [e.kind for e in _log(runtime, job_id)][-2:] == ["step.succeeded", "job.succeeded"]
    steps = [e.kind for e in _log(runtime, job_id) if e.kind.startswith("step.")]
    assert steps == ["step.running", "step.progress", "step.progress", "step.succeeded"]


def test_notices_are_numbered_into_the_same_log(runtime: Runtime) -> None:
    job = run_items(
        runtime, [{"id": "a"}], owner="events", pipeline="notices-numbered", diff_mode=True
    )
    with unit_of_work(runtime.sessions) as session:
        notices = notice_events(session, job.id)
        log = events_after(session, job.id, 0)

    assert [e.kind for e in notices] == ["new_items"]
    assert sorted(e.seq for e in log) == list(range(1, len(log) + 1))


def test_the_log_goes_with_its_job(runtime: Runtime) -> None:
    job_id = _submit(runtime, TWO_STEPS)
    with unit_of_work(runtime.sessions) as session:
        session.execute(delete(JobRow).where(JobRow.id == job_id))
    with unit_of_work(runtime.sessions) as session:
        left = session.scalars(select(JobEventRow).where(JobEventRow.job_id == job_id)).all()
    assert left == []


def test_a_job_is_settled_once_final(runtime: Runtime) -> None:
    job_id = _submit(runtime, TWO_STEPS)
    with unit_of_work(runtime.sessions) as session:
        assert not job_settled(session, job_id)
    for step in ("a", "b"):
        run_step(runtime, StepKey(job_id, step), task_id=uuid.uuid4().hex)
    with unit_of_work(runtime.sessions) as session:
        assert job_settled(session, job_id)
        assert job_settled(session, uuid.uuid4())


def test_the_stream_of_all_jobs_keeps_to_its_owner(runtime: Runtime) -> None:
    mine = _submit(runtime, TWO_STEPS, owner=f"mine-{uuid.uuid4().hex[:6]}")
    theirs = _submit(runtime, TWO_STEPS, owner=f"theirs-{uuid.uuid4().hex[:6]}")
    with unit_of_work(runtime.sessions) as session:
        owner = session.get(JobRow, mine)
        assert owner is not None
        start = owner.created_at
        seen = events_since(session, owner=owner.owner, pipeline=None, since=start)
        every = events_since(session, owner=None, pipeline="two-steps", since=start)

    assert {e.job_id for e in seen} == {mine}
    assert {mine, theirs} <= {e.job_id for e in every}


@pytest.mark.timeout(30)
def test_the_listener_is_told_each_commit_that_logs_an_event(runtime: Runtime) -> None:
    listener = EventListener(runtime.settings.require_database_url()).start()
    heard: list[uuid.UUID | None] = []
    news = threading.Event()

    def wake(job_id: uuid.UUID | None) -> None:
        heard.append(job_id)
        news.set()

    try:
        listener.subscribe(None, wake)
        job_id = _submit(runtime, TWO_STEPS)
        assert news.wait(10)
    finally:
        listener.stop()
    assert heard == [job_id]


@pytest.mark.timeout(30)
def test_logging_a_change_never_waits_on_a_transaction_that_holds_the_job_row(
    runtime: Runtime,
) -> None:
    """The engine locks a job row FOR UPDATE while it settles a step (``record_failure``);
    another step of the job committing meanwhile must not wait for it, or the two would each
    hold what the other's commit needs: the job row, and the job's event counter."""
    job_id = _submit(runtime, TWO_STEPS)
    holder = psycopg.connect(_conninfo(runtime))
    other = psycopg.connect(_conninfo(runtime))
    try:
        holder.execute("SELECT 1 FROM jobs WHERE id = %s FOR UPDATE", (job_id,))
        holder.execute(
            "UPDATE step_runs SET status = 'skipped' WHERE job_id = %s AND step_id = 'a'",
            (job_id,),
        )
        committed = threading.Event()

        def commit_other() -> None:
            other.execute(
                "UPDATE step_runs SET status = 'skipped' WHERE job_id = %s AND step_id = 'b'",
                (job_id,),
            )
            other.commit()
            committed.set()

        thread = threading.Thread(target=commit_other)
        thread.start()
        assert committed.wait(5), "a commit waited on the job row held by another transaction"
        holder.commit()
        thread.join()
    finally:
        holder.close()
        other.close()

    assert [(e.seq, e.step_id) for e in _log(runtime, job_id) if e.kind == "step.skipped"] == [
        (2, "b"),
        (3, "a"),
    ]
