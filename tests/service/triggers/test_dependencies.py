"""Dependency triggers: a saved pipeline with ``on: {succeeded: [...]}`` runs once for each
success of its owner's upstream jobs, reading the upstream result as ``${{ trigger.result }}``."""

import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from service.catalogue.retention import prune_dependency_fires
from service.catalogue.saving import delete_pipeline, save_pipeline
from service.engine.claims import claim_step
from service.engine.runner import run_step
from service.engine.runtime import Runtime
from service.engine.shards import FannedOut, fan_out
from service.engine.steps import FanOutDue, StepKey
from service.engine.submission import JobRequest, submit_job
from service.language.loading import find_profile, load_profile_text
from service.language.plan import JobPlan
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from service.platform.errors import ProfileInvalid, TriggerCycle
from service.platform.models import (
    DependencyFireRow,
    DependencyQueueRow,
    JobRow,
    PipelineRow,
    PipelineTriggerRow,
    StepRunRow,
)
from service.triggers.dependencies import fire_dependents
from tests.support.runs import run_items
from tests.support.scans import sequential_scans

UP = "name: up\nsteps:\n  - {id: a, action: noop, with: {found: [1, 2]}}\n"
DOWN = """\
name: down
on:
  succeeded: [up]
steps:
  - id: b
    action: noop
    with: {from: "${{ trigger.job_id }}", got: "${{ trigger.result.a.found }}"}
"""


def _owner() -> str:
    return f"dep-{uuid.uuid4().hex[:8]}"


def _save(rt: Runtime, owner: str, text: str) -> None:
    with unit_of_work(rt.sessions) as session:
        save_pipeline(
            session,
            owner=owner,
            name=None,
            body=text,
            settings=rt.settings,
            known_actions=rt.registry.names(),
        )


def _succeed_up(rt: Runtime, owner: str) -> uuid.UUID:
    with unit_of_work(rt.sessions) as session:
        job, _ = submit_job(
            session,
            JobRequest(pipeline="up", params={}),
            owner=owner,
            profiles_dir=rt.settings.profiles_dir,
            known_actions=rt.registry.names(),
        )
    run_step(rt, StepKey(job.id, "a"), task_id=uuid.uuid4().hex)
    return job.id


def _fire(rt: Runtime) -> list[JobRow]:
    with unit_of_work(rt.sessions) as session:
        return fire_dependents(
            session, profiles_dir=rt.settings.profiles_dir, known_actions=rt.registry.names()
        )


def _downstream(rt: Runtime, owner: str, pipeline: str = "down") -> list[JobRow]:
    with unit_of_work(rt.sessions) as session:
        return list(
            session.scalars(
                select(JobRow)
                .where(JobRow.owner == owner, JobRow.pipeline == pipeline)
                .order_by(JobRow.created_at)
            )
        )


ON_NEW = """\
name: fresh
on:
  new_items: [papers]
steps:
  - id: b
    action: noop
    with: {papers: "${{ trigger.new_items }}"}
"""


def test_a_new_items_trigger_fires_only_on_runs_with_new_items_and_gets_them(
    runtime: Runtime,
) -> None:
    owner = _owner()
    _save(runtime, owner, ON_NEW)
    first = run_items(runtime, [{"id": "a"}], owner=owner, pipeline="papers")
    _fire(runtime)
    run_items(runtime, [{"id": "a"}], owner=owner, pipeline="papers")
    _fire(runtime)
    third = run_items(runtime, [{"id": "a"}, {"id": "b"}], owner=owner, pipeline="papers")
    _fire(runtime)

    jobs = _downstream(runtime, owner, "fresh")
    assert [job.parent_job_id for job in jobs] == [first.id, third.id]
    assert [job.trigger_data["new_items"] for job in jobs if job.trigger_data] == [
        [{"id": "a"}],
        [{"id": "b"}],
    ]


FAN_NEW = """\
name: each-fresh
on:
  new_items: [papers]
steps:
  - id: each
    action: noop
    for_each: {items: "${{ trigger.new_items }}"}
    with: {paper: "${{ item }}"}
"""


def _fanned_items(rt: Runtime, job_id: uuid.UUID) -> list[Any]:
    """The items the claim of the job's for_each step fanned out into shards, in order."""
    with unit_of_work(rt.sessions) as session:
        now = utcnow()
        due = claim_step(
            session, StepKey(job_id, "each"), task_id=uuid.uuid4().hex, lease_s=30, now=now
        )
        assert isinstance(due, FanOutDue)
        assert isinstance(fan_out(session, due, now, max_items=100, max_job_steps=1000), FannedOut)
        return list(
            session.scalars(
                select(StepRunRow.item)
                .where(StepRunRow.job_id == job_id, StepRunRow.shard >= 0)
                .order_by(StepRunRow.shard)
            )
        )


def test_a_for_each_over_the_new_items_fans_out_over_just_those(runtime: Runtime) -> None:
    owner = _owner()
    _save(runtime, owner, FAN_NEW)
    run_items(runtime, [{"id": "a"}], owner=owner, pipeline="papers")
    _fire(runtime)
    run_items(runtime, [{"id": "a"}, {"id": "b"}, {"id": "c"}], owner=owner, pipeline="papers")
    _fire(runtime)

    first, second = _downstream(runtime, owner, "each-fresh")
    assert _fanned_items(runtime, first.id) == [{"id": "a"}]
    assert _fanned_items(runtime, second.id) == [{"id": "b"}, {"id": "c"}]


def test_the_fence_of_a_pruned_upstream_job_is_pruned(runtime: Runtime) -> None:
    owner = _owner()
    _save(runtime, owner, UP)
    _save(runtime, owner, DOWN)
    kept, gone = _succeed_up(runtime, owner), _succeed_up(runtime, owner)
    _fire(runtime)
    with unit_of_work(runtime.sessions) as session:
        session.delete(session.get(JobRow, gone))

    with unit_of_work(runtime.sessions) as session:
        prune_dependency_fires(session)

    with unit_of_work(runtime.sessions) as session:
        fenced = set(
            session.scalars(
                select(DependencyFireRow.upstream_job_id).where(
                    DependencyFireRow.upstream_job_id.in_([kept, gone])
                )
            )
        )
    assert fenced == {kept}


def test_a_profile_file_with_on_is_refused(tmp_path: Path) -> None:
    (tmp_path / "down.yaml").write_text(DOWN, encoding="utf-8")

    with pytest.raises(ProfileInvalid) as info:
        find_profile(tmp_path, "down")

    assert info.value.details["errors"][0]["code"] == "on_in_file"


def test_a_success_starts_each_waiting_pipeline_once_with_the_upstream_result(
    runtime: Runtime,
) -> None:
    owner = _owner()
    _save(runtime, owner, UP)
    _save(runtime, owner, DOWN)
    upstream = _succeed_up(runtime, owner)

    _fire(runtime)
    _fire(runtime)

    [job] = _downstream(runtime, owner)
    assert (job.trigger, job.parent_job_id) == ("dependency", upstream)
    run_step(runtime, StepKey(job.id, "b"), task_id=uuid.uuid4().hex)
    with unit_of_work(runtime.sessions) as session:
        done = session.get(JobRow, job.id)
    assert done is not None and done.status == "succeeded"
    assert done.result == {"b": {"from": str(upstream), "got": [1, 2]}}


def test_the_queue_is_drained_oldest_first_through_its_index(runtime: Runtime) -> None:
    """With sequential scans priced out, a drain that had to sort the whole queue would scan
    it anyway."""
    owner = _owner()
    _save(runtime, owner, UP)
    _save(runtime, owner, DOWN)
    first, second = _succeed_up(runtime, owner), _succeed_up(runtime, owner)

    with (
        unit_of_work(runtime.sessions) as session,
        sequential_scans(session, "dependency_queue") as taken,
    ):
        started = fire_dependents(
            session,
            profiles_dir=runtime.settings.profiles_dir,
            known_actions=runtime.registry.names(),
        )
        scans = taken()

    assert scans == 0
    assert [job.parent_job_id for job in started if job.owner == owner] == [first, second]


def _run_b(rt: Runtime, owner: str, pipeline: str) -> StepRunRow:
    """Step ``b`` of the one job ``pipeline`` has, run once, as it stands afterwards."""
    [job] = _downstream(rt, owner, pipeline)
    run_step(rt, StepKey(job.id, "b"), task_id=uuid.uuid4().hex)
    with unit_of_work(rt.sessions) as session:
        return session.scalars(
            select(StepRunRow).where(StepRunRow.job_id == job.id, StepRunRow.step_id == "b")
        ).one()


def _gated(name: str, condition: str) -> str:
    return f"""\
name: {name}
on:
  succeeded: [up]
steps:
  - id: b
    action: noop
    when: "{condition}"
"""


def test_a_when_reading_the_upstream_result_runs_or_skips_the_step(runtime: Runtime) -> None:
    owner = _owner()
    _save(runtime, owner, UP)
    _save(runtime, owner, _gated("holds", "${{ trigger.result.a.found[1] }} == 2"))
    _save(runtime, owner, _gated("fails", "${{ trigger.result.a.found[1] }} > 2"))
    _succeed_up(runtime, owner)
    _fire(runtime)

    outcome = {pipeline: _run_b(runtime, owner, pipeline).status for pipeline in ("holds", "fails")}
    assert outcome == {"holds": "succeeded", "fails": "skipped"}


VERIFIED = """\
name: NAME
on:
  succeeded: [up]
steps:
  - id: b
    action: noop
    with: {count: 2}
    verify:
      - expr: "RULE"
        retry: false
"""


def test_a_verify_rule_reading_the_upstream_result_passes_or_fails_the_step(
    runtime: Runtime,
) -> None:
    owner = _owner()
    _save(runtime, owner, UP)
    for name, operator in (("enough", ">="), ("short", ">")):
        rule = f"${{{{ output.count }}}} {operator} ${{{{ trigger.result.a.found[1] }}}}"
        _save(runtime, owner, VERIFIED.replace("NAME", name).replace("RULE", rule))
    _succeed_up(runtime, owner)
    _fire(runtime)

    outcome = {pipeline: _run_b(runtime, owner, pipeline) for pipeline in ("enough", "short")}
    assert outcome["enough"].status == "succeeded"
    assert outcome["short"].status == "failed"
    error = outcome["short"].error
    assert error is not None and error["code"] == "verification_failed"


ROUNDS_FROM_UPSTREAM = """\
name: rounds
on:
  succeeded: [up]
loops:
  - steps: [draft]
    until: "${{ loop.round }} >= ${{ trigger.result.a.found[1] }}"
    max_rounds: 5
steps:
  - id: draft
    action: noop
    with: {round: "${{ loop.round }}"}
"""


def test_a_loop_until_reading_the_upstream_result_ends_when_it_holds(runtime: Runtime) -> None:
    owner = _owner()
    _save(runtime, owner, UP)
    _save(runtime, owner, ROUNDS_FROM_UPSTREAM)
    _succeed_up(runtime, owner)
    _fire(runtime)
    [job] = _downstream(runtime, owner, "rounds")

    rounds = 0
    plan = [StepKey(job.id, "draft")]
    while plan:
        rounds += 1
        ready = run_step(runtime, plan.pop(), task_id=uuid.uuid4().hex)
        assert isinstance(ready, JobPlan)
        plan += [StepKey(job.id, step.step_id) for step in ready.steps]
    with unit_of_work(runtime.sessions) as session:
        done = session.get(JobRow, job.id)
    assert done is not None and done.status == "succeeded"
    assert rounds == 2, "found[1] is 2: the loop ends after its second round"


def test_each_success_starts_its_own_job_and_other_owners_start_nothing(
    runtime: Runtime,
) -> None:
    owner, stranger = _owner(), _owner()
    _save(runtime, owner, UP)
    _save(runtime, owner, DOWN)
    _save(runtime, stranger, UP)
    firsts = {_succeed_up(runtime, owner), _succeed_up(runtime, owner)}
    _succeed_up(runtime, stranger)

    _fire(runtime)

    assert {job.parent_job_id for job in _downstream(runtime, owner)} == firsts
    assert _downstream(runtime, stranger) == []


DEDUPED_DOWN = """\
name: down
on:
  succeeded: [up]
dedupe: {key: digest, window_s: 3600}
steps:
  - {id: b, action: noop, with: {from: "${{ trigger.job_id }}"}}
"""


def test_a_success_whose_downstream_job_would_duplicate_an_open_one_starts_nothing(
    runtime: Runtime,
) -> None:
    owner = _owner()
    _save(runtime, owner, UP)
    _save(runtime, owner, DEDUPED_DOWN)
    first = _succeed_up(runtime, owner)
    _fire(runtime)
    second = _succeed_up(runtime, owner)

    assert _fire(runtime) == []

    [job] = _downstream(runtime, owner)
    assert job.parent_job_id == first and job.trigger_data is not None
    assert job.trigger_data["job_id"] == str(first)
    with unit_of_work(runtime.sessions) as session:
        fences = session.execute(
            select(DependencyFireRow.upstream_job_id, DependencyFireRow.job_id)
        ).all()
    assert {(first, job.id), (second, job.id)} <= {tuple(fence) for fence in fences}


def test_a_success_nothing_waits_for_is_not_queued(runtime: Runtime) -> None:
    owner = _owner()
    _save(runtime, owner, UP)
    upstream = _succeed_up(runtime, owner)
    with unit_of_work(runtime.sessions) as session:
        assert session.get(DependencyQueueRow, upstream) is None


def test_a_deleted_downstream_pipeline_waits_no_more(runtime: Runtime) -> None:
    owner = _owner()
    _save(runtime, owner, UP)
    _save(runtime, owner, DOWN)
    with unit_of_work(runtime.sessions) as session:
        delete_pipeline(session, "down", viewer=owner, profiles_dir=runtime.settings.profiles_dir)
    _succeed_up(runtime, owner)

    _fire(runtime)

    assert _downstream(runtime, owner) == []


def test_a_save_that_closes_a_cycle_is_refused_and_stores_nothing(runtime: Runtime) -> None:
    owner = _owner()
    _save(runtime, owner, "name: a\non: {succeeded: [c]}\nsteps: [{id: s, action: noop}]\n")
    _save(runtime, owner, "name: b\non: {succeeded: [a]}\nsteps: [{id: s, action: noop}]\n")

    with pytest.raises(TriggerCycle) as info:
        _save(runtime, owner, "name: c\non: {succeeded: [b]}\nsteps: [{id: s, action: noop}]\n")

    assert info.value.details["cycle"] == ["c", "a", "b", "c"]
    with unit_of_work(runtime.sessions) as session:
        saved = session.scalars(select(PipelineRow.name).where(PipelineRow.owner == owner)).all()
        edges = session.execute(
            select(PipelineTriggerRow.upstream, PipelineTriggerRow.downstream).where(
                PipelineTriggerRow.owner == owner
            )
        ).all()
    assert sorted(saved) == ["a", "b"]
    assert sorted(edges) == [("a", "b"), ("c", "a")]


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("name: self\non: {succeeded: [self]}\nsteps: [{id: s, action: noop}]\n", "trigger_cycle"),
        ("name: self\non: {new_items: [self]}\nsteps: [{id: s, action: noop}]\n", "trigger_cycle"),
        ("name: x\non: {succeeded: [a], new_items: [a]}\nsteps: [{id: s, action: noop}]\n", None),
        ("name: x\non: {}\nsteps: [{id: s, action: noop}]\n", None),
        (
            "name: lost\nsteps: [{id: s, action: noop, with: {x: '${{ trigger.result }}'}}]\n",
            "bad_reference",
        ),
        (
            "name: lost\nsteps: [{id: s, action: noop, when: '${{ trigger.job_id }} != \"\"'}]\n",
            "bad_reference",
        ),
        (
            "name: lost\nloops: [{steps: [s], until: '${{ trigger.job_id }} != \"\"'}]\n"
            "steps: [{id: s, action: noop}]\n",
            "bad_reference",
        ),
        (
            "name: lost\nsteps: [{id: s, action: noop, "
            "verify: [{expr: '${{ trigger.job_id }} != \"\"'}]}]\n",
            "bad_reference",
        ),
        (
            "name: odd\non: {succeeded: [up]}\n"
            "steps: [{id: s, action: noop, with: {x: '${{ trigger.owner }}'}}]\n",
            "bad_reference",
        ),
    ],
)
def test_profiles_that_cannot_be_triggered_as_written_are_refused(
    text: str, code: str | None
) -> None:
    with pytest.raises(ProfileInvalid) as info:
        load_profile_text(text, source="p.yaml")
    if code is not None:
        assert info.value.details["errors"][0]["code"] == code


def test_on_is_read_as_a_key_although_yaml_1_1_calls_it_true() -> None:
    profile = load_profile_text(DOWN, source="down.yaml")
    assert profile.on is not None and profile.on.succeeded == ["up"]
    assert profile.to_json()["on"] == {"succeeded": ["up"]}
