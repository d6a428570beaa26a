"""Saved pipelines: versions by content hash, visibility, sharing, and what a job runs."""

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.catalogue.pipelines import SYSTEM_OWNER, get_pipeline, list_pipelines, list_versions
from service.catalogue.saving import delete_pipeline, save_pipeline, set_share
from service.engine.runtime import Runtime
from service.engine.submission import JobRequest, submit_job
from service.platform.db import unit_of_work
from service.platform.errors import (
    InvalidShare,
    PipelineNameMismatch,
    PipelineReadOnly,
    ProfileInvalid,
    ProfileNotFound,
)
from service.platform.models import JobRow, PipelineRow, PipelineVersionRow

PROFILES = Path(__file__).resolve().parents[2] / "profiles"


def weekly(name: str, *, tag: str = "lit", extra_step: bool = False) -> str:
    steps = "  - {id: search, action: noop}\n"
    if extra_step:
        steps += "  - {id: digest, action: noop, depends_on: [search]}\n"
    return f"name: {name}\ntags: [{tag}]\ndescription: weekly search\nsteps:\n{steps}"


def unique_name() -> str:
    return f"p-{uuid.uuid4().hex[:10]}"


def unique_owner() -> str:
    return f"o-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def rt(runtime: Runtime) -> Runtime:
    return runtime


@pytest.fixture
def session(rt: Runtime) -> Iterator[Session]:
    with unit_of_work(rt.sessions) as s:
        yield s


def save(rt: Runtime, owner: str, body: str | dict[str, Any], name: str | None = None) -> Any:
    with unit_of_work(rt.sessions) as s:
        return save_pipeline(
            s,
            owner=owner,
            name=name,
            body=body,
            settings=rt.settings,
            known_actions=rt.registry.names(),
        )


def stored(rt: Runtime, owner: str, name: str) -> tuple[int, int]:
    """(pipelines, versions) stored for one owner's name."""
    with rt.sessions() as s:
        pipelines = s.scalar(
            select(func.count())
            .select_from(PipelineRow)
            .where(PipelineRow.owner == owner, PipelineRow.name == name)
        )
        versions = s.scalar(
            select(func.count())
            .select_from(PipelineVersionRow)
            .join(PipelineRow)
            .where(PipelineRow.owner == owner, PipelineRow.name == name)
        )
        return pipelines or 0, versions or 0


def test_a_save_keeps_a_version_and_an_unchanged_body_makes_none(rt: Runtime) -> None:
    owner, name = unique_owner(), unique_name()
    first = save(rt, owner, weekly(name), name)
    again = save(rt, owner, weekly(name).replace("tags: [lit]", "tags:   ['lit']"), name)
    changed = save(rt, owner, weekly(name, extra_step=True), name)

    assert first.created_version and first.view.version == 1
    assert not again.created_version and again.view.version == 1
    assert again.view.content_hash == first.view.content_hash
    assert changed.created_version and changed.view.version == 2
    assert stored(rt, owner, name) == (1, 2)


def test_a_version_keeps_the_text_it_was_saved_from_and_comments_alone_make_no_new_one(
    rt: Runtime,
) -> None:
    owner, name = unique_owner(), unique_name()
    text = "# the lab's weekly search\n" + weekly(name) + "# ends here\n"
    first = save(rt, owner, text, name)
    recommented = save(rt, owner, "# another comment\n" + weekly(name), name)
    mapping = {"name": name, "steps": [{"id": "only", "action": "noop"}]}
    from_mapping = save(rt, owner, mapping, name)
    with unit_of_work(rt.sessions) as s:
        kept = get_pipeline(s, name, viewer=owner, profiles_dir=PROFILES, version=1)
        current = get_pipeline(s, name, viewer=owner, profiles_dir=PROFILES)
        shipped = get_pipeline(s, "slow", viewer=owner, profiles_dir=PROFILES)

    assert first.created_version and first.view.source == text
    # Only comments changed: the same content hash, so no new version, and the first text stays.
    assert not recommented.created_version and recommented.view.source == text
    assert kept.source == text
    assert from_mapping.created_version and from_mapping.view.source is None
    assert current.version == 2 and current.source is None
    assert shipped.source is None
    assert stored(rt, owner, name) == (1, 2)


def test_text_over_the_body_limit_is_saved_without_its_text(rt: Runtime) -> None:
    owner, name = unique_owner(), unique_name()
    small = rt.settings.model_copy(update={"max_body_bytes": 200})
    text = weekly(name) + "# " + "x" * 200 + "\n"
    with unit_of_work(rt.sessions) as s:
        outcome = save_pipeline(
            s, owner=owner, name=name, body=text, settings=small, known_actions=rt.registry.names()
        )
    with unit_of_work(rt.sessions) as s:
        view = get_pipeline(s, name, viewer=owner, profiles_dir=PROFILES)

    assert outcome.created_version and outcome.view.source is None
    assert view.version == 1 and view.source is None


def test_json_and_yaml_bodies_of_the_same_profile_are_one_version(rt: Runtime) -> None:
    owner, name = unique_owner(), unique_name()
    document = {"name": name, "tags": ["lit"], "steps": [{"id": "search", "action": "noop"}]}
    as_yaml = save(rt, owner, f"name: {name}\ntags: [lit]\nsteps: [{{id: search, action: noop}}]")
    as_json = save(rt, owner, json.dumps(document))
    as_mapping = save(rt, owner, document)

    assert as_yaml.created_version
    assert not as_json.created_version and not as_mapping.created_version


def test_saving_an_older_content_makes_that_version_current_again(rt: Runtime) -> None:
    owner, name = unique_owner(), unique_name()
    save(rt, owner, weekly(name), name)
    save(rt, owner, weekly(name, extra_step=True), name)
    reverted = save(rt, owner, weekly(name), name)

    assert not reverted.created_version and reverted.view.version == 1
    with rt.sessions() as s:
        versions = list_versions(s, name, viewer=owner)
    assert [(v.version, v.current) for v in versions] == [(2, False), (1, True)]


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ("name: other\nsteps: [{{id: a, action: noop}}]", PipelineNameMismatch),
        ("name: {name}\nsteps: [{{id: a, action: nosuch}}]", ProfileInvalid),
        ("name: {name}\nsteps: [", ProfileInvalid),
        ("name: {name}\nsteps: []", ProfileInvalid),
    ],
)
def test_a_refused_save_stores_nothing(rt: Runtime, body: str, code: type[Exception]) -> None:
    owner, name = unique_owner(), unique_name()
    with pytest.raises(code):
        save(rt, owner, body.format(name=name), name)
    assert stored(rt, owner, name) == (0, 0)


def test_shipped_profiles_are_read_only_pipelines_of_system(rt: Runtime, session: Session) -> None:
    owner = unique_owner()
    with pytest.raises(PipelineReadOnly):
        save(rt, owner, "name: dag\nsteps: [{id: a, action: noop}]", "dag")
    with pytest.raises(PipelineReadOnly):
        delete_pipeline(session, "dag", viewer=owner, profiles_dir=PROFILES)

    view = get_pipeline(session, "dag", viewer=owner, profiles_dir=PROFILES)
    listed = list_pipelines(session, viewer=owner, profiles_dir=PROFILES)

    assert view.owner == SYSTEM_OWNER and view.read_only and view.version is None
    assert {v.name for v in listed if v.owner == SYSTEM_OWNER} >= {"dag", "flaky"}


def test_owners_see_their_own_shared_and_system_pipelines_only(rt: Runtime) -> None:
    alice, bob, carol = unique_owner(), unique_owner(), unique_owner()
    name = unique_name()
    tag = f"t{uuid.uuid4().hex[:6]}"
    save(rt, alice, weekly(name, tag=tag), name)
    with unit_of_work(rt.sessions) as s:
        assert set_share(s, name, bob, shared=True, viewer=alice, profiles_dir=PROFILES) == [bob]

    with rt.sessions() as s:
        for_bob = list_pipelines(s, viewer=bob, profiles_dir=PROFILES, tag=tag)
        for_carol = list_pipelines(s, viewer=carol, profiles_dir=PROFILES, tag=tag)
        for_admin = list_pipelines(s, viewer=carol, profiles_dir=PROFILES, tag=tag, admin=True)
        shared = get_pipeline(s, name, viewer=bob, profiles_dir=PROFILES)
        with pytest.raises(ProfileNotFound):
            get_pipeline(s, name, viewer=carol, profiles_dir=PROFILES)

    assert [(v.name, v.owner, v.read_only) for v in for_bob] == [(name, alice, True)]
    assert for_carol == []
    assert [(v.name, v.owner) for v in for_admin] == [(name, alice)]
    assert shared.read_only and shared.shared_with == []


def test_a_shared_pipeline_cannot_be_changed_by_its_grantee(rt: Runtime) -> None:
    alice, bob = unique_owner(), unique_owner()
    name = unique_name()
    save(rt, alice, weekly(name), name)
    with unit_of_work(rt.sessions) as s:
        set_share(s, name, bob, shared=True, viewer=alice, profiles_dir=PROFILES)

    with unit_of_work(rt.sessions) as s, pytest.raises(PipelineReadOnly):
        delete_pipeline(s, name, viewer=bob, profiles_dir=PROFILES)
    with unit_of_work(rt.sessions) as s, pytest.raises(PipelineReadOnly):
        set_share(s, name, unique_owner(), shared=True, viewer=bob, profiles_dir=PROFILES)
    with unit_of_work(rt.sessions) as s, pytest.raises(InvalidShare):
        set_share(s, name, alice, shared=True, viewer=alice, profiles_dir=PROFILES)
    assert stored(rt, alice, name) == (1, 1)


def test_unsharing_hides_the_pipeline_again(rt: Runtime) -> None:
    alice, bob = unique_owner(), unique_owner()
    name = unique_name()
    save(rt, alice, weekly(name), name)
    with unit_of_work(rt.sessions) as s:
        set_share(s, name, bob, shared=True, viewer=alice, profiles_dir=PROFILES)
        assert set_share(s, name, bob, shared=False, viewer=alice, profiles_dir=PROFILES) == []
    with rt.sessions() as s, pytest.raises(ProfileNotFound):
        get_pipeline(s, name, viewer=bob, profiles_dir=PROFILES)


def submit(rt: Runtime, owner: str, name: str) -> JobRow:
    with unit_of_work(rt.sessions) as s:
        job, _ = submit_job(
            s,
            JobRequest(pipeline=name, params={}),
            owner=owner,
            profiles_dir=PROFILES,
            known_actions=rt.registry.names(),
            publish_now=False,
        )
        return job


def test_a_job_runs_the_own_then_the_shared_pipeline_and_records_the_version(
    rt: Runtime,
) -> None:
    alice, bob = unique_owner(), unique_owner()
    name = unique_name()
    save(rt, alice, weekly(name), name)
    save(rt, alice, weekly(name, extra_step=True), name)
    with unit_of_work(rt.sessions) as s:
        set_share(s, name, bob, shared=True, viewer=alice, profiles_dir=PROFILES)

    by_alice = submit(rt, alice, name)
    by_bob_shared = submit(rt, bob, name)
    save(rt, bob, weekly(name), name)
    by_bob_own = submit(rt, bob, name)

    assert (by_alice.pipeline_version, len(by_alice.profile["steps"])) == (2, 2)
    assert by_bob_shared.pipeline_id == by_alice.pipeline_id
    assert by_bob_own.pipeline_id != by_alice.pipeline_id
    assert (by_bob_own.pipeline_version, len(by_bob_own.profile["steps"])) == (1, 1)
    with rt.sessions() as s:
        listed = list_pipelines(s, viewer=alice, profiles_dir=PROFILES)
    assert next(v.run_count for v in listed if v.name == name) == 2


def test_a_name_nobody_saved_still_runs_the_shipped_profile(rt: Runtime) -> None:
    job = submit(rt, unique_owner(), "timeout")
    assert job.pipeline == "timeout" and job.pipeline_id is None and job.pipeline_version is None


def test_delete_keeps_history_unless_purged(rt: Runtime) -> None:
    owner = unique_owner()
    kept, purged = unique_name(), unique_name()
    for name in (kept, purged):
        save(rt, owner, weekly(name), name)
        submit(rt, owner, name)

    with unit_of_work(rt.sessions) as s:
        assert delete_pipeline(s, kept, viewer=owner, profiles_dir=PROFILES) == 0
        assert (
            delete_pipeline(s, purged, viewer=owner, profiles_dir=PROFILES, purge_history=True) == 1
        )

    with rt.sessions() as s:
        remaining = s.scalars(select(JobRow.pipeline).where(JobRow.owner == owner)).all()
    assert remaining == [kept]
    assert stored(rt, owner, kept) == (0, 0) and stored(rt, owner, purged) == (0, 0)
    with rt.sessions() as s, pytest.raises(ProfileNotFound):
        delete_pipeline(s, kept, viewer=owner, profiles_dir=PROFILES)


def test_purging_a_shared_pipeline_keeps_the_runs_of_those_it_was_shared_with(
    rt: Runtime,
) -> None:
    alice, bob = unique_owner(), unique_owner()
    name = unique_name()
    save(rt, alice, weekly(name), name)
    with unit_of_work(rt.sessions) as s:
        set_share(s, name, bob, shared=True, viewer=alice, profiles_dir=PROFILES)
    alices, bobs = submit(rt, alice, name), submit(rt, bob, name)

    with unit_of_work(rt.sessions) as s:
        purged = delete_pipeline(s, name, viewer=alice, profiles_dir=PROFILES, purge_history=True)

    assert purged == 1
    with rt.sessions() as s:
        left = set(s.scalars(select(JobRow.id).where(JobRow.id.in_([alices.id, bobs.id]))))
    assert left == {bobs.id}


def test_an_unknown_version_is_not_found(rt: Runtime, session: Session) -> None:
    owner, name = unique_owner(), unique_name()
    save(rt, owner, weekly(name), name)
    assert get_pipeline(session, name, viewer=owner, profiles_dir=PROFILES, version=1).version == 1
    with pytest.raises(ProfileNotFound):
        get_pipeline(session, name, viewer=owner, profiles_dir=PROFILES, version=2)


def test_concurrent_saves_number_versions_without_gaps_or_duplicates(rt: Runtime) -> None:
    from concurrent.futures import ThreadPoolExecutor

    owner, name = unique_owner(), unique_name()
    bodies = [weekly(name, tag=f"t{i % 3}") for i in range(9)]
    with ThreadPoolExecutor(max_workers=3) as pool:
        outcomes = list(pool.map(lambda body: save(rt, owner, body, name), bodies))

    assert sum(outcome.created_version for outcome in outcomes) == 3
    with rt.sessions() as s:
        versions = list_versions(s, name, viewer=owner)
    assert sorted(v.version for v in versions) == [1, 2, 3]
    assert len({v.content_hash for v in versions}) == 3


def test_owner_slash_name_picks_one_of_two_pipelines_shared_under_the_same_name(
    rt: Runtime,
) -> None:
    alice, carol, bob, dave = (unique_owner() for _ in range(4))
    name = unique_name()
    save(rt, alice, weekly(name), name)
    save(rt, carol, weekly(name, extra_step=True), name)
    save(rt, dave, weekly(name), name)
    with unit_of_work(rt.sessions) as s:
        set_share(s, name, bob, shared=True, viewer=alice, profiles_dir=PROFILES)
        set_share(s, name, bob, shared=True, viewer=carol, profiles_dir=PROFILES)

    from_alice = submit(rt, bob, f"{alice}/{name}")
    from_carol = submit(rt, bob, f"{carol}/{name}")

    assert (from_alice.pipeline, len(from_alice.profile["steps"])) == (name, 1)
    assert (from_carol.pipeline, len(from_carol.profile["steps"])) == (name, 2)
    assert from_alice.pipeline_id != from_carol.pipeline_id
    with pytest.raises(ProfileNotFound):
        submit(rt, bob, f"{dave}/{name}")
    with pytest.raises(ProfileNotFound):
        submit(rt, bob, f"{alice}/timeout")
