"""Durable waits in process: a wait step parks at its claim, the beat leader's ``wake_due``
succeeds it at its time, and nothing else (a redelivery, the sweeper) moves it meanwhile."""

import json
import uuid
from datetime import datetime, timedelta
from typing import Any

import jsonschema
import pytest
from sqlalchemy import select

from service.actions.registry import ActionRegistry
from service.cli.app import console
from service.cli.follow import print_changes
from service.cli.jobs import view_document
from service.engine.jobs import cancel_job, get_job, job_view
from service.engine.runner import run_step
from service.engine.runtime import Runtime
from service.engine.shards import FannedOut
from service.engine.steps import StepKey
from service.engine.sweeper import sweep
from service.engine.waits import next_wake, wake_due
from service.language.checks import validate_profile
from service.language.plan import JobPlan
from service.language.profiles import SCHEMA_PATH
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from service.platform.errors import ProfileInvalid
from service.platform.models import JobRow, StepRunRow
from service.platform.states import JobStatus, StepStatus
from tests.support.arrange import walk
from tests.support.fanouts import submitted

WAIT_S = 60


def waiting(wait: dict[str, Any], params: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "name": "pause",
        "params": params or {},
        "steps": [
            {"id": "pause", "action": "wait", "with": wait},
            {
                "id": "after",
                "action": "noop",
                "depends_on": ["pause"],
                "with": {"woke": "${{ steps.pause.output }}"},
            },
        ],
    }


def claimed(rt: Runtime, job_id: uuid.UUID, step_id: str = "pause") -> JobPlan:
    plan = run_step(rt, StepKey(job_id, step_id), task_id=f"t-{uuid.uuid4().hex[:8]}")
    assert not isinstance(plan, FannedOut)
    return plan


def row_of(rt: Runtime, job_id: uuid.UUID, step_id: str = "pause") -> StepRunRow:
    with unit_of_work(rt.sessions) as session:
        row = session.scalars(
            select(StepRunRow).where(StepRunRow.job_id == job_id, StepRunRow.step_id == step_id)
        ).one()
        session.expunge(row)
        return row


def job_status(rt: Runtime, job_id: uuid.UUID) -> str:
    with unit_of_work(rt.sessions) as session:
        status = session.scalar(select(JobRow.status).where(JobRow.id == job_id))
        assert status is not None
        return status


def woken(rt: Runtime, at: datetime) -> list[JobPlan]:
    with unit_of_work(rt.sessions) as session:
        return wake_due(session, at)


def test_a_wait_step_parks_without_a_lease_and_its_job_stays_running(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    job_id = submitted(runtime, waiting({"seconds": WAIT_S}), {})
    leftovers.append(job_id)

    assert claimed(runtime, job_id).steps == []

    row = row_of(runtime, job_id)
    assert row.status == StepStatus.SLEEPING
    assert row.lease_token is None and row.lease_until is None
    assert row.started_at is not None and row.wake_at == row.started_at + timedelta(seconds=WAIT_S)
    assert job_status(runtime, job_id) == JobStatus.RUNNING
    with unit_of_work(runtime.sessions) as session:
        view = job_view(session, get_job(session, job_id))
    pause = {s.step_id: s for s in view.steps}["pause"]
    assert (pause.status, pause.wake_at) == (StepStatus.SLEEPING, row.wake_at)
    with console.capture() as printed:
        print_changes(view, {})
    assert f"sleeping until {row.wake_at.isoformat()}" in printed.get()
    assert view_document(view)["steps"][0]["wake_at"] == row.wake_at.isoformat()
    assert claimed(runtime, job_id).steps == [], "a redelivery leaves a sleeper asleep"
    assert row_of(runtime, job_id).status == StepStatus.SLEEPING


def test_the_beat_wakes_a_sleeper_at_its_time_and_releases_its_children(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    job_id = submitted(runtime, waiting({"seconds": WAIT_S}), {})
    leftovers.append(job_id)
    claimed(runtime, job_id)
    wake_at = row_of(runtime, job_id).wake_at
    assert wake_at is not None
    with unit_of_work(runtime.sessions) as session:
        assert (soonest := next_wake(session)) is not None and soonest <= wake_at

    assert not [p for p in woken(runtime, wake_at - timedelta(seconds=1)) if p.job_id == job_id]
    assert row_of(runtime, job_id).status == StepStatus.SLEEPING
    plans = [p for p in woken(runtime, wake_at) if p.job_id == job_id]

    assert [s.step_id for plan in plans for s in plan.steps] == ["after"]
    row = row_of(runtime, job_id)
    assert row.status == StepStatus.SUCCEEDED and row.finished_at == wake_at
    with unit_of_work(runtime.sessions) as session:
        pause = session.get(StepRunRow, (job_id, "pause", -1))
        assert pause is not None and pause.output["waited_s"] == WAIT_S
    assert all(p.job_id != job_id for p in woken(runtime, wake_at)), "woken once"
    claimed(runtime, job_id, "after")
    assert job_status(runtime, job_id) == JobStatus.SUCCEEDED


def test_an_until_in_the_past_means_no_wait(runtime: Runtime, leftovers: list[uuid.UUID]) -> None:
    job_id = submitted(runtime, waiting({"until": "2020-01-01T00:00:00+00:00"}), {})
    leftovers.append(job_id)

    plan = claimed(runtime, job_id)

    assert [s.step_id for s in plan.steps] == ["after"]
    assert row_of(runtime, job_id).status == StepStatus.SUCCEEDED


def test_an_until_resolved_from_a_param_sets_the_wake_time(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    at = (utcnow() + timedelta(hours=2)).replace(microsecond=0)
    profile = waiting({"until": "${{ params.at }}"}, {"at": {"type": "string"}})
    job_id = submitted(runtime, profile, {"at": at.isoformat()})
    leftovers.append(job_id)

    claimed(runtime, job_id)

    assert row_of(runtime, job_id).wake_at == at


def test_a_wait_whose_when_is_false_is_skipped_without_waiting(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    profile = waiting({"seconds": WAIT_S}, {"hold": {"type": "boolean"}})
    profile["steps"][0]["when"] = "${{ params.hold }}"
    job_id = submitted(runtime, profile, {"hold": False})
    leftovers.append(job_id)

    plan = claimed(runtime, job_id)

    assert [s.step_id for s in plan.steps] == ["after"]
    row = row_of(runtime, job_id)
    assert (row.status, row.wake_at) == (StepStatus.SKIPPED, None)


def test_seconds_a_param_makes_no_number_of_fails_the_step_for_good(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    profile = waiting({"seconds": "${{ params.delay }}"}, {"delay": {"type": "string"}})
    job_id = submitted(runtime, profile, {"delay": "soon"})
    leftovers.append(job_id)

    claimed(runtime, job_id)

    row = row_of(runtime, job_id)
    assert row.status == StepStatus.FAILED
    assert row.error is not None and row.error["code"] == "wait_invalid"
    assert job_status(runtime, job_id) == JobStatus.FAILED


def test_a_cancelled_jobs_sleeper_ends_cancelled_and_is_not_woken(runtime: Runtime) -> None:
    job_id = submitted(runtime, waiting({"seconds": WAIT_S}), {})
    claimed(runtime, job_id)
    with unit_of_work(runtime.sessions) as session:
        _, running = cancel_job(session, job_id, owner=None, now=utcnow())

    assert running == [], "a sleeper has no task to revoke"
    assert row_of(runtime, job_id).status == StepStatus.CANCELLED
    later = utcnow() + timedelta(seconds=WAIT_S + 1)
    assert all(p.job_id != job_id for p in woken(runtime, later))
    assert row_of(runtime, job_id).status == StepStatus.CANCELLED


def test_a_sleeper_its_job_left_behind_is_neither_woken_nor_awaited(runtime: Runtime) -> None:
    job_id = submitted(runtime, waiting({"seconds": 1}), {})
    claimed(runtime, job_id)
    with unit_of_work(runtime.sessions) as session:
        walk(session, JobRow, JobRow.id == job_id, to=JobStatus.CANCELLED)
    wake_at = row_of(runtime, job_id).wake_at

    assert all(p.job_id != job_id for p in woken(runtime, utcnow() + timedelta(seconds=5)))
    with unit_of_work(runtime.sessions) as session:
        assert next_wake(session) != wake_at
    assert row_of(runtime, job_id).status == StepStatus.SLEEPING


def test_the_sweeper_leaves_a_sleeping_job_alone(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    job_id = submitted(runtime, waiting({"seconds": 3600}), {})
    leftovers.append(job_id)
    claimed(runtime, job_id)

    for after_s in (10, 600):
        with unit_of_work(runtime.sessions) as session:
            report = sweep(
                session,
                now=utcnow() + timedelta(seconds=after_s),
                broker_lost=False,
                stall_after_s=60,
                dispatch_grace_s=5,
                held=frozenset(),
            )
        assert job_id not in report.redispatch, after_s


def invalid(step: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = {"name": "bad", "steps": [{"id": "pause", "action": "wait", **step}]}
    with pytest.raises(ProfileInvalid) as info:
        validate_profile(data, source="profiles/bad.yaml", known_actions={"noop"})
    assert info.value.message.startswith("profiles/bad.yaml: step 'pause'")
    first: dict[str, Any] = info.value.details["errors"][0]
    return first


@pytest.mark.parametrize(
    ("step", "field"),
    [
        ({"with": {}}, "steps[0].with"),
        ({"with": {"seconds": 1, "until": "2030-01-01T00:00:00Z"}}, "steps[0].with"),
        ({"with": {"seconds": 91 * 86400}}, "steps[0].with.seconds"),
        ({"with": {"seconds": True}}, "steps[0].with.seconds"),
        ({"with": {"until": "2030-01-01T09:00:00"}}, "steps[0].with.until"),
        ({"with": {"until": "next tuesday"}}, "steps[0].with.until"),
        ({"with": {"seconds": 1, "note": "x"}}, "steps[0].with.note"),
        (
            {"with": {"seconds": 1}, "for_each": {"items": "${{ params.xs }}"}},
            "steps[0].for_each",
        ),
        ({"with": {"seconds": 1}, "approval": {"required": True}}, "steps[0].approval"),
    ],
)
def test_a_malformed_wait_step_is_refused_naming_its_field(
    step: dict[str, Any], field: str
) -> None:
    error = invalid(step)
    assert (error["code"], error["field"], error["step"]) == ("wait_invalid", field, "pause")


def test_a_wait_step_is_valid_with_any_registered_actions() -> None:
    for wait in ({"seconds": 0}, {"seconds": "${{ params.s }}"}, {"until": "2030-01-01T09:00Z"}):
        data = {
            "name": "ok",
            "params": {"s": {"type": "number"}},
            "steps": [{"id": "pause", "action": "wait", "with": wait}],
        }
        assert validate_profile(data, source="ok.yaml", known_actions=set()).steps[0].with_ == wait


def test_no_action_may_take_the_name_wait() -> None:
    with pytest.raises(ValueError, match="durable wait"):
        ActionRegistry().register("wait", lambda ctx: None)


def test_a_wait_step_cannot_be_inside_a_loop() -> None:
    data = {
        "name": "polls",
        "steps": [
            {"id": "poll", "action": "noop"},
            {"id": "pause", "action": "wait", "with": {"seconds": 5}, "depends_on": ["poll"]},
        ],
        "loops": [{"steps": ["poll", "pause"], "until": "${{ loop.round }} >= 3"}],
    }
    with pytest.raises(ProfileInvalid, match="wait steps cannot be inside a loop"):
        validate_profile(data, source="polls.yaml", known_actions={"noop"})


@pytest.mark.parametrize(
    ("wait", "ok"),
    [
        ({"seconds": 5}, True),
        ({"seconds": "${{ params.s }}"}, True),
        ({"until": "2030-01-01T00:00:00Z"}, True),
        ({"seconds": 5, "until": "2030-01-01T00:00:00Z"}, False),
        ({"seconds": "soon"}, False),
        ({}, False),
    ],
)
def test_the_json_schema_describes_a_wait_step(wait: dict[str, Any], ok: bool) -> None:
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    data = {"name": "x", "steps": [{"id": "pause", "action": "wait", "with": wait}]}
    if ok:
        jsonschema.validate(data, schema)
    else:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(data, schema)
