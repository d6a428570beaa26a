"""Sub-pipelines in process: a ``pipeline.run`` step parks at its claim, the beat leader's
``advance_children`` starts its child once, settles the step from the child's end, holds the
depth cap and cancels the children of a job cancelled; a save that closes a circle of calls
is refused."""

import json
import uuid
from datetime import datetime, timedelta
from typing import Any

import jsonschema
import pytest
from sqlalchemy import select

from service.catalogue.saving import save_pipeline
from service.engine.children import ChildWork, Starter, advance_children, job_depth, next_retry
from service.engine.family import Parent
from service.engine.jobs import cancel_job, get_job, job_view
from service.engine.reruns import RerunRequest, rerun_job
from service.engine.runner import run_step
from service.engine.runtime import Runtime
from service.engine.shards import FannedOut
from service.engine.steps import StepKey
from service.engine.submission import JobRequest, submit_job
from service.language.checks import validate_profile
from service.language.plan import JobPlan, load_plan
from service.language.profiles import SCHEMA_PATH
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from service.platform.errors import PipelineCycle, ProfileInvalid
from service.platform.models import ChildCallRow, JobRow, StepRunRow
from service.platform.states import JobStatus, StepStatus
from tests.support.scans import sequential_scans


def child_profile(name: str = "kid", fails: bool = False) -> dict[str, Any]:
    step = {"id": "work", "action": "noop", "with": {"doubled": "${{ params.x }}"}}
    if fails:
        step = {"id": "work", "action": "fail", "with": {"retryable": False}}
    return {"name": name, "params": {"x": {"type": "integer", "default": 1}}, "steps": [step]}


def parent_profile(call: dict[str, Any], retry: int = 1, backoff_s: float = 0.0) -> dict[str, Any]:
    policy = {"attempts": retry, "backoff_s": backoff_s, "jitter": 0}
    return {
        "name": "parent",
        "steps": [
            {"id": "call", "action": "pipeline.run", "with": call, "retry": policy},
            {
                "id": "after",
                "action": "noop",
                "depends_on": ["call"],
                "with": {"got": "${{ steps.call.output }}"},
            },
        ],
    }


def saved(rt: Runtime, owner: str, profile: dict[str, Any]) -> None:
    with unit_of_work(rt.sessions) as session:
        save_pipeline(
            session,
            owner=owner,
            name=None,
            body=profile,
            settings=rt.settings,
            known_actions=rt.registry.names(),
        )


def submitted(rt: Runtime, owner: str, profile: dict[str, Any]) -> uuid.UUID:
    with unit_of_work(rt.sessions) as session:
        job, _ = submit_job(
            session,
            JobRequest(pipeline=profile, params={}),
            owner=owner,
            profiles_dir=rt.settings.profiles_dir,
            known_actions=rt.registry.names(),
        )
    return job.id


def ran(rt: Runtime, job_id: uuid.UUID, step_id: str) -> JobPlan:
    plan = run_step(rt, StepKey(job_id, step_id), task_id=f"t-{uuid.uuid4().hex[:8]}")
    assert not isinstance(plan, FannedOut)
    return plan


def advanced(rt: Runtime, max_depth: int = 5, at: datetime | None = None) -> ChildWork:
    starter = Starter(rt.settings.profiles_dir, rt.registry.names(), max_depth)
    with unit_of_work(rt.sessions) as session:
        return advance_children(session, at or utcnow(), starter)


def step_row(rt: Runtime, job_id: uuid.UUID, step_id: str = "call") -> StepRunRow:
    with unit_of_work(rt.sessions) as session:
        row = session.scalars(
            select(StepRunRow).where(StepRunRow.job_id == job_id, StepRunRow.step_id == step_id)
        ).one()
        session.expunge(row)
        return row


def job_row(rt: Runtime, job_id: uuid.UUID) -> JobRow:
    with unit_of_work(rt.sessions) as session:
        job = session.get(JobRow, job_id)
        assert job is not None
        session.expunge(job)
        return job


def children_of(rt: Runtime, job_id: uuid.UUID) -> list[uuid.UUID]:
    with unit_of_work(rt.sessions) as session:
        return [
            child
            for child in session.scalars(
                select(ChildCallRow.child_job_id)
                .where(ChildCallRow.job_id == job_id)
                .order_by(ChildCallRow.attempt)
            )
            if child is not None
        ]


def output_of(rt: Runtime, job_id: uuid.UUID, step_id: str) -> Any:
    with unit_of_work(rt.sessions) as session:
        return session.scalar(
            select(StepRunRow.output).where(
                StepRunRow.job_id == job_id,
                StepRunRow.output.is_not(None),
                StepRunRow.step_id == step_id,
            )
        )


@pytest.fixture
def owner(runtime: Runtime) -> str:
    name = f"o-{uuid.uuid4().hex[:8]}"
    saved(runtime, name, child_profile())
    saved(runtime, name, child_profile("broken", fails=True))
    return name


def test_a_waiting_call_parks_starts_one_child_and_reads_its_result(
    runtime: Runtime, owner: str, leftovers: list[uuid.UUID]
) -> None:
    job_id = submitted(runtime, owner, parent_profile({"pipeline": "kid", "params": {"x": 7}}))
    leftovers.append(job_id)

    assert ran(runtime, job_id, "call").steps == []
    row = step_row(runtime, job_id)
    assert row.status == StepStatus.AWAITING_CHILD and row.lease_token is None
    assert ran(runtime, job_id, "call").steps == [], "a redelivery starts nothing more"

    started = [j for j in advanced(runtime).started if j.id in set(children_of(runtime, job_id))]
    assert len(started) == 1
    child = started[0]
    assert (child.owner, child.trigger, child.params) == (owner, "parent", {"x": 7})
    assert child.parent_job_id is None, "parent_job_id stays a rerun's or a trigger's"
    with unit_of_work(runtime.sessions) as session:
        family = job_view(session, get_job(session, child.id)).family
        assert family.parent == Parent(job_id, "child", "call")
        (link,) = job_view(session, get_job(session, job_id)).family.children
        assert (link.job_id, link.step_id, link.attempt) == (child.id, "call", 1)
    advanced(runtime)
    assert children_of(runtime, job_id) == [child.id], "one child per attempt"
    assert step_row(runtime, job_id).status == StepStatus.AWAITING_CHILD

    ran(runtime, child.id, "work")
    assert job_row(runtime, child.id).status == JobStatus.SUCCEEDED
    ready = [p for p in advanced(runtime).ready if p.job_id == job_id]
    assert [s.step_id for p in ready for s in p.steps] == ["after"]
    assert step_row(runtime, job_id).status == StepStatus.SUCCEEDED
    result = job_row(runtime, child.id).result
    assert output_of(runtime, job_id, "call") == result
    ran(runtime, job_id, "after")
    assert output_of(runtime, job_id, "after") == {"got": result}
    assert job_row(runtime, job_id).status == JobStatus.SUCCEEDED


def test_a_tick_reads_only_the_calls_not_yet_started(runtime: Runtime) -> None:
    """A started call stays as its family's record, and the leader looks several times a
    second: with sequential scans priced out, a tick scans the calls only if no index holds
    those it starts."""
    starter = Starter(runtime.settings.profiles_dir, runtime.registry.names(), 5)
    with (
        unit_of_work(runtime.sessions) as session,
        sequential_scans(session, "child_calls") as taken,
    ):
        advance_children(session, utcnow(), starter)
        assert taken() == 0


def test_a_failed_child_fails_the_step_after_its_retry_started_a_new_child(
    runtime: Runtime, owner: str, leftovers: list[uuid.UUID]
) -> None:
    job_id = submitted(runtime, owner, parent_profile({"pipeline": "broken"}, retry=2))
    leftovers.append(job_id)
    for attempt in (1, 2):
        ran(runtime, job_id, "call")
        advanced(runtime)
        child = children_of(runtime, job_id)[-1]
        ran(runtime, child, "work")
        assert job_row(runtime, child).status == JobStatus.FAILED
        work = advanced(runtime)
        if attempt == 1:
            again = [s.step_id for p in work.ready if p.job_id == job_id for s in p.steps]
            assert again == ["call"] and step_row(runtime, job_id).status == StepStatus.RETRYING

    assert len(set(children_of(runtime, job_id))) == 2
    row = step_row(runtime, job_id)
    assert row.status == StepStatus.FAILED and row.attempts == 2
    assert row.error is not None and row.error["details"]["child_job_id"] == str(child)
    assert job_row(runtime, job_id).status == JobStatus.FAILED


def test_a_retry_after_a_failed_child_waits_its_backoff_with_no_message_out(
    runtime: Runtime, owner: str, leftovers: list[uuid.UUID]
) -> None:
    job_id = submitted(runtime, owner, parent_profile({"pipeline": "broken"}, 2, backoff_s=30))
    leftovers.append(job_id)
    ran(runtime, job_id, "call")
    advanced(runtime)
    (child,) = children_of(runtime, job_id)
    ran(runtime, child, "work")
    failed_at = utcnow()

    work = advanced(runtime, at=failed_at)

    assert [s for p in work.ready if p.job_id == job_id for s in p.steps] == []
    row = step_row(runtime, job_id)
    assert row.status == StepStatus.RETRYING and row.wake_at is not None
    assert row.wake_at == failed_at + timedelta(seconds=30)
    with unit_of_work(runtime.sessions) as session:
        assert next_retry(session) is not None
        assert load_plan(session, job_id) == JobPlan(job_id, pipeline="parent"), "not the sweeper's"
    early = advanced(runtime, at=row.wake_at - timedelta(seconds=1))
    assert [s for p in early.ready if p.job_id == job_id for s in p.steps] == []

    due = advanced(runtime, at=row.wake_at)

    again = [s.step_id for p in due.ready if p.job_id == job_id for s in p.steps]
    assert again == ["call"]
    assert step_row(runtime, job_id).wake_at is None, "sent once"
    ran(runtime, job_id, "call")
    advanced(runtime)
    assert len(children_of(runtime, job_id)) == 2


def test_a_call_that_does_not_wait_succeeds_with_its_childs_id(
    runtime: Runtime, owner: str, leftovers: list[uuid.UUID]
) -> None:
    job_id = submitted(runtime, owner, parent_profile({"pipeline": "kid", "wait": False}))
    leftovers.append(job_id)
    ran(runtime, job_id, "call")

    work = advanced(runtime)

    (child,) = children_of(runtime, job_id)
    leftovers.append(child)
    assert child in {j.id for j in work.started}
    assert [s.step_id for p in work.ready if p.job_id == job_id for s in p.steps] == ["after"]
    assert output_of(runtime, job_id, "call") == {"job_id": str(child)}
    assert job_row(runtime, child).status == JobStatus.QUEUED


def test_a_child_deeper_than_the_cap_fails_its_step_saying_so(
    runtime: Runtime, owner: str, leftovers: list[uuid.UUID]
) -> None:
    saved(runtime, owner, {**parent_profile({"pipeline": "kid"}), "name": "mid"})
    job_id = submitted(runtime, owner, parent_profile({"pipeline": "mid"}))
    leftovers.append(job_id)
    ran(runtime, job_id, "call")
    advanced(runtime, max_depth=1)
    (mid,) = children_of(runtime, job_id)
    leftovers.append(mid)
    ran(runtime, mid, "call")

    advanced(runtime, max_depth=1)

    with unit_of_work(runtime.sessions) as session:
        assert job_depth(session, mid, 5) == 1
    row = step_row(runtime, mid)
    assert row.status == StepStatus.FAILED
    assert row.error is not None and row.error["code"] == "pipeline_depth_exceeded"
    assert "FLOWBEAT_MAX_PIPELINE_DEPTH" in row.error["message"]
    assert children_of(runtime, mid) == []


def test_cancelling_the_parent_cancels_its_running_child(
    runtime: Runtime, owner: str, leftovers: list[uuid.UUID]
) -> None:
    job_id = submitted(runtime, owner, parent_profile({"pipeline": "kid"}))
    leftovers.append(job_id)
    ran(runtime, job_id, "call")
    advanced(runtime)
    (child,) = children_of(runtime, job_id)
    with unit_of_work(runtime.sessions) as session:
        cancel_job(session, job_id, owner=None, now=utcnow())
    assert step_row(runtime, job_id).status == StepStatus.CANCELLED

    advanced(runtime)

    ended = job_row(runtime, child)
    assert ended.status == JobStatus.CANCELLED
    assert ended.error is not None and ended.error["code"] == "parent_ended"


def test_a_call_that_resolves_to_no_call_fails_its_step(
    runtime: Runtime, owner: str, leftovers: list[uuid.UUID]
) -> None:
    job_id = submitted(runtime, owner, parent_profile({"pipeline": "nobody-has-this"}))
    leftovers.append(job_id)
    ran(runtime, job_id, "call")

    advanced(runtime)

    row = step_row(runtime, job_id)
    assert row.status == StepStatus.FAILED
    assert row.error is not None and row.error["code"] == "pipeline_not_found"


def test_a_save_that_closes_a_circle_of_calls_is_refused(runtime: Runtime, owner: str) -> None:
    saved(runtime, owner, {**parent_profile({"pipeline": "b"}), "name": "a"})
    with pytest.raises(PipelineCycle) as refused:
        saved(runtime, owner, {**parent_profile({"pipeline": "a"}), "name": "b"})
    assert refused.value.details["cycle"] == ["b", "a", "b"]
    with pytest.raises(PipelineCycle):
        saved(runtime, owner, {**parent_profile({"pipeline": "self"}), "name": "self"})
    saved(runtime, owner, {**parent_profile({"pipeline": "kid"}), "name": "b"})


@pytest.mark.parametrize(
    ("call", "field"),
    [
        ({}, "with.pipeline"),
        ({"pipeline": "kid", "extra": 1}, "with.extra"),
        ({"pipeline": "kid", "wait": "yes"}, "with.wait"),
        ({"pipeline": "kid", "params": [1]}, "with.params"),
    ],
)
def test_a_malformed_call_is_refused_naming_its_field(call: dict[str, Any], field: str) -> None:
    with pytest.raises(ProfileInvalid) as refused:
        validate_profile(parent_profile(call), source="parent.yaml")
    errors = refused.value.details["errors"]
    assert {(e["code"], e["step"], e["field"]) for e in errors} >= {
        ("child_invalid", "call", f"steps[0].{field}")
    }
    assert refused.value.message.startswith("parent.yaml: step 'call'")


def test_a_call_inside_a_loop_is_refused() -> None:
    profile = parent_profile({"pipeline": "kid"})
    profile["loops"] = [{"steps": ["call", "after"], "max_rounds": 2, "until": "1 >= 1"}]
    with pytest.raises(ProfileInvalid, match=r"pipeline\.run steps cannot be inside a loop"):
        validate_profile(profile, source="parent.yaml")


def test_a_rerun_takes_the_child_that_succeeded_instead_of_running_it_again(
    runtime: Runtime, owner: str, leftovers: list[uuid.UUID]
) -> None:
    job_id = submitted(runtime, owner, parent_profile({"pipeline": "kid", "params": {"x": 4}}))
    ran(runtime, job_id, "call")
    advanced(runtime)
    (child,) = children_of(runtime, job_id)
    ran(runtime, child, "work")
    advanced(runtime)
    ran(runtime, job_id, "after")
    assert job_row(runtime, job_id).status == JobStatus.SUCCEEDED
    with unit_of_work(runtime.sessions) as session:
        again = rerun_job(
            session, job_id, RerunRequest(from_step="call"), visible_to=None, now=utcnow()
        ).id
    leftovers.append(again)

    ran(runtime, again, "call")
    work = advanced(runtime)

    assert children_of(runtime, again) == [child]
    assert not {j.id for j in work.started} & {again, child}
    assert [s.step_id for p in work.ready if p.job_id == again for s in p.steps] == ["after"]
    assert output_of(runtime, again, "call") == job_row(runtime, child).result


def test_the_json_schema_flags_a_malformed_call_as_it_is_typed() -> None:
    schema = json.loads(SCHEMA_PATH.read_text())
    good = parent_profile({"pipeline": "kid", "params": "${{ params.all }}", "wait": False})
    jsonschema.validate(good, schema)
    malformed: list[dict[str, Any]] = [
        {"pipeline": "kid", "wait": "yes"},
        {"params": {}},
        {"pipeline": "kid", "x": 1},
    ]
    for bad in malformed:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(parent_profile(bad), schema)


def test_a_call_that_passes_a_secret_on_is_refused() -> None:
    profile = parent_profile({"pipeline": "kid", "params": {"token": "${{ secrets.TOKEN }}"}})
    with pytest.raises(ProfileInvalid, match=r"a pipeline\.run step reads no secret"):
        validate_profile(profile, source="parent.yaml")
