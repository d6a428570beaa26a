"""The row triggers on a job's or a step's status change: what each one does, and that each
tests one small condition before it calls its function, since PostgreSQL prepares a
trigger's condition again for every statement that fires it (ADR 23)."""

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from sqlalchemy import text

from service.engine.events import events_after
from service.engine.runtime import Runtime
from service.platform.db import libpq_url, unit_of_work
from service.platform.models import JobRow, StepRunRow
from tests.support.fanouts import submitted

CHAIN = {
    "name": "status-triggers",
    "steps": [{"id": "a", "action": "noop"}, {"id": "b", "action": "noop", "depends_on": ["a"]}],
}
_CONDITIONS = """
SELECT t.tgname, length(t.tgqual) FROM pg_trigger AS t
 WHERE t.tgrelid IN ('jobs'::regclass, 'step_runs'::regclass) AND NOT t.tgisinternal
   AND t.tgtype & 16 <> 0"""
"""The stored conditions of the update triggers, as the node text PostgreSQL reads back
(``tgtype`` bit 16: fires on UPDATE)."""
_CALLS = """
SELECT p.proname, pg_stat_get_xact_function_calls(p.oid) FROM pg_proc AS p
 WHERE p.proname LIKE 'flowbeat%' AND pg_stat_get_xact_function_calls(p.oid) > 0"""
"""The functions this transaction has called so far, and how often."""


def _set(
    rt: Runtime,
    table: type[JobRow] | type[StepRunRow],
    where: str,
    *,
    marked: bool = False,
    **values: Any,
) -> None:
    """``marked``: as a statement that logs its change itself (``inline_events.mark``)."""
    assignments = ", ".join(f"{column} = :{column}" for column in values)
    if marked:
        assignments += ", logged_inline = NOT logged_inline"
    with unit_of_work(rt.sessions) as session:
        session.execute(
            text(f"UPDATE {table.__tablename__} SET {assignments} WHERE {where}"),
            values,
        )


@contextmanager
def _schedule_notices(rt: Runtime) -> Iterator[list[str]]:
    heard: list[str] = []
    with psycopg.connect(libpq_url(rt.settings.require_database_url()), autocommit=True) as beat:
        beat.add_notify_handler(lambda notice: heard.append(notice.payload))
        beat.execute("LISTEN flowbeat_schedules")
        yield heard
        beat.execute("SELECT 1")


def _job(rt: Runtime, leftovers: list[uuid.UUID]) -> uuid.UUID:
    job_id = submitted(rt, CHAIN, {})
    leftovers.append(job_id)
    return job_id


def test_the_update_triggers_read_short_conditions(runtime: Runtime) -> None:
    """Read back for each statement that fires them: before ADR 23, the conditions of these
    triggers came to about 17,800 characters, the fan-out's progress alone to 4,841."""
    with unit_of_work(runtime.sessions) as session:
        lengths = {name: length for name, length in session.execute(text(_CONDITIONS))}
    assert "step_runs_progress_event" not in lengths
    assert 0 < sum(lengths.values()) < 7_000


def test_a_change_the_step_path_logs_itself_calls_no_trigger_function(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    """The claim's and the checkpoint's moves ask the lifecycle table once each and queue no
    trigger event, deferred ones included."""
    job_id = _job(runtime, leftovers)
    mark = "logged_inline = NOT logged_inline"
    with unit_of_work(runtime.sessions) as session:
        session.execute(text("SET LOCAL track_functions = 'pl'"))
        session.execute(text("SET CONSTRAINTS ALL IMMEDIATE"))
        for move in ("running", "succeeded"):
            session.execute(
                text(f"UPDATE jobs SET status = :move, {mark} WHERE id = :job"),
                {"move": move, "job": job_id},
            )
            session.execute(
                text(
                    f"UPDATE step_runs SET status = :move, {mark}"
                    " WHERE job_id = :job AND step_id = 'a'"
                ),
                {"move": move, "job": job_id},
            )
        calls = {name: count for name, count in session.execute(text(_CALLS))}
    assert calls == {"flowbeat_move_allowed": 4}


@dataclass(frozen=True)
class Wake:
    """A row others wait on: what it holds, the moves that wake nobody, the move that wakes
    the beat, and what the beat hears."""

    table: type[JobRow] | type[StepRunRow]
    holds: dict[str, Any]
    quiet: tuple[str, ...]
    wakes: str
    heard: str


WAKES = {
    "a step holding a slot stops running": Wake(
        StepRunRow, {"slot_key": "k"}, ("running",), "succeeded", "concurrency"
    ),
    "a job with a concurrency key ends": Wake(
        JobRow, {"concurrency_key": "k"}, ("running",), "failed", "concurrency"
    ),
    "a child job ends": Wake(JobRow, {"trigger": "parent"}, ("running",), "succeeded", "child"),
    "a step waiting on its child is cancelled": Wake(
        StepRunRow, {}, ("running", "awaiting_child"), "cancelled", "child"
    ),
}


@pytest.mark.parametrize("wake", WAKES.values(), ids=WAKES.keys())
def test_the_beat_is_woken_by_the_move_it_waits_for_and_no_other(
    runtime: Runtime, leftovers: list[uuid.UUID], wake: Wake
) -> None:
    job_id = _job(runtime, leftovers)
    row = f"id = '{job_id}'" if wake.table is JobRow else f"job_id = '{job_id}' AND step_id = 'a'"
    if wake.holds:
        _set(runtime, wake.table, row, **wake.holds)
    with _schedule_notices(runtime) as heard:
        for move in wake.quiet:
            _set(runtime, wake.table, row, status=move)
        assert heard == []
        _set(runtime, wake.table, row, status=wake.wakes)
    assert heard == [wake.heard]


def test_a_change_a_statement_did_not_log_itself_is_logged_once(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    job_id = _job(runtime, leftovers)
    step = f"job_id = '{job_id}' AND step_id = 'a'"
    with unit_of_work(runtime.sessions) as session:
        before = len(events_after(session, job_id, 0))

    _set(runtime, JobRow, f"id = '{job_id}'", status="running")
    _set(runtime, StepRunRow, step, status="running")
    _set(runtime, StepRunRow, step, attempts=5)
    _set(runtime, StepRunRow, step, status="running")
    _set(runtime, JobRow, f"id = '{job_id}'", status="running")

    with unit_of_work(runtime.sessions) as session:
        logged = events_after(session, job_id, 0)[before:]
    assert [(event.kind, event.step_id) for event in logged] == [
        ("job.running", None),
        ("step.running", "a"),
        ("step.running", "a"),
    ]
    assert logged[-1].data["attempt"] == 5


def test_a_change_its_statement_logged_itself_is_not_logged_again(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    job_id = _job(runtime, leftovers)
    with unit_of_work(runtime.sessions) as session:
        before = len(events_after(session, job_id, 0))

    _set(runtime, JobRow, f"id = '{job_id}'", status="running", marked=True)
    _set(
        runtime,
        StepRunRow,
        f"job_id = '{job_id}' AND step_id = 'a'",
        status="running",
        marked=True,
    )

    with unit_of_work(runtime.sessions) as session:
        assert events_after(session, job_id, 0)[before:] == []
