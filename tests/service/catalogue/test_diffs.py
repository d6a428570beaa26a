"""Result items are stored with the run that found them and diffed in PostgreSQL."""

import uuid
from typing import Any

import pytest
from sqlalchemy import select

from service.catalogue.diffs import DiffKind, diff_counts, diff_page
from service.engine.events import Event, notice_events
from service.engine.runtime import Runtime
from service.platform.db import unit_of_work
from service.platform.errors import InvalidCursor, NoResultItems
from service.platform.models import JobRow, ResultItemRow
from tests.support.runs import run_items


def _items(*keys: str) -> list[dict[str, Any]]:
    return [{"id": key, "title": f"paper {key}"} for key in keys]


def _owner() -> str:
    return f"diffs-{uuid.uuid4().hex[:8]}"


def _all_pages(rt: Runtime, job: JobRow, kind: DiffKind, limit: int) -> list[str]:
    keys: list[str] = []
    cursor = None
    with unit_of_work(rt.sessions) as session:
        while True:
            page = diff_page(session, job, kind, limit=limit, cursor=cursor)
            assert len(page.items) <= limit
            keys += [item["id"] for item in page.items]
            cursor = page.next_cursor
            if cursor is None:
                return keys


CASES = [
    pytest.param([], ["a", "b"], {"new": 2, "removed": 0, "unchanged": 0}, id="first-run"),
    pytest.param(["a", "b"], ["a", "b"], {"new": 0, "removed": 0, "unchanged": 2}, id="same"),
    pytest.param(["a", "b"], ["b", "c"], {"new": 1, "removed": 1, "unchanged": 1}, id="shifted"),
    pytest.param(["a", "b"], [], {"new": 0, "removed": 2, "unchanged": 0}, id="all-gone"),
    pytest.param(
        ["a", "b", "c", "d", "e"],
        ["c", "d", "e", "f", "g", "h", "i"],
        {"new": 4, "removed": 2, "unchanged": 3},
        id="overlap",
    ),
]


@pytest.mark.parametrize(("before", "after", "counts"), CASES)
def test_a_run_is_diffed_against_the_previous_successful_run(
    runtime: Runtime, before: list[str], after: list[str], counts: dict[str, int]
) -> None:
    owner = _owner()
    if before:
        first = run_items(runtime, _items(*before), owner=owner, pipeline="search")
        assert first.status == "succeeded"
    second = run_items(runtime, _items(*after), owner=owner, pipeline="search")

    with unit_of_work(runtime.sessions) as session:
        assert diff_counts(session, second).as_dict() == counts
    assert second.item_count == len(after)
    assert (second.new_count, second.removed_count) == (counts["new"], counts["removed"])
    assert _all_pages(runtime, second, DiffKind.NEW, 2) == sorted(set(after) - set(before))
    assert _all_pages(runtime, second, DiffKind.REMOVED, 2) == sorted(set(before) - set(after))
    assert _all_pages(runtime, second, DiffKind.UNCHANGED, 2) == sorted(set(before) & set(after))


def test_paging_returns_every_item_once_in_key_order(runtime: Runtime) -> None:
    keys = [f"k{n:03d}" for n in range(25)]
    job = run_items(runtime, _items(*keys), owner=_owner(), pipeline="paged")

    for limit in (1, 7, 25, 100):
        assert _all_pages(runtime, job, DiffKind.NEW, limit) == keys


def test_the_previous_run_is_the_same_pipeline_and_owner_and_skips_failed_runs(
    runtime: Runtime,
) -> None:
    owner = _owner()
    base = run_items(runtime, _items("a"), owner=owner, pipeline="mine")
    run_items(runtime, _items("x"), owner=owner, pipeline="other")
    run_items(runtime, _items("y"), owner=_owner(), pipeline="mine")
    broken = run_items(runtime, [{"title": "no key"}], owner=owner, pipeline="mine")
    latest = run_items(runtime, _items("a", "b"), owner=owner, pipeline="mine")

    assert broken.status == "failed"
    assert latest.previous_job_id == base.id
    assert (latest.new_count, latest.removed_count) == (1, 0)


def test_an_item_without_its_key_fails_the_job_and_stores_nothing(runtime: Runtime) -> None:
    job = run_items(runtime, [{"id": "a"}, {"title": "keyless"}], owner=_owner(), pipeline="bad")

    assert job.status == "failed"
    assert job.error is not None and job.error["code"] == "result_key_missing"
    assert job.error["details"]["index"] == 1
    with unit_of_work(runtime.sessions) as session:
        stored = session.scalars(select(ResultItemRow).where(ResultItemRow.job_id == job.id))
        assert list(stored) == []
        with pytest.raises(NoResultItems):
            diff_counts(session, job)


def test_duplicate_keys_keep_the_first_item(runtime: Runtime) -> None:
    items = [{"id": "a", "v": 1}, {"id": "b", "v": 2}, {"id": "a", "v": 3}]
    job = run_items(runtime, items, owner=_owner(), pipeline="dupes")

    assert job.status == "succeeded" and job.item_count == 2
    with unit_of_work(runtime.sessions) as session:
        page = diff_page(session, job, DiffKind.NEW, limit=10)
    assert page.items == [{"id": "a", "v": 1}, {"id": "b", "v": 2}]


def test_numeric_keys_are_compared_as_text(runtime: Runtime) -> None:
    owner = _owner()
    run_items(runtime, [{"pmid": 1}, {"pmid": 2}], owner=owner, pipeline="pm", key="pmid")
    job = run_items(runtime, [{"pmid": 2}, {"pmid": 3}], owner=owner, pipeline="pm", key="pmid")

    assert (job.new_count, job.removed_count) == (1, 1)


def test_a_job_without_a_result_block_has_no_diff(runtime: Runtime) -> None:
    from service.engine.submission import JobRequest, submit_job

    with unit_of_work(runtime.sessions) as session:
        job, _ = submit_job(
            session,
            JobRequest(pipeline="slow", params={}),
            owner=_owner(),
            profiles_dir=runtime.settings.profiles_dir,
            known_actions=runtime.registry.names(),
        )
        with pytest.raises(NoResultItems):
            diff_page(session, job, DiffKind.NEW, limit=10)


def test_a_cursor_it_did_not_issue_is_refused(runtime: Runtime) -> None:
    job = run_items(runtime, _items("a"), owner=_owner(), pipeline="cursor")
    with unit_of_work(runtime.sessions) as session, pytest.raises(InvalidCursor):
        diff_page(session, job, DiffKind.NEW, limit=10, cursor="%%%")


def _events(rt: Runtime, job_id: uuid.UUID) -> list[Event]:
    with unit_of_work(rt.sessions) as session:
        return notice_events(session, job_id)


def test_diff_mode_marks_a_run_without_new_items_and_records_no_event(runtime: Runtime) -> None:
    owner = _owner()
    first = run_items(runtime, _items("a"), owner=owner, pipeline="watch", diff_mode=True)
    second = run_items(runtime, _items("a"), owner=owner, pipeline="watch", diff_mode=True)

    assert "no_new_items" not in first.result
    assert [event.kind for event in _events(runtime, first.id)] == ["new_items"]
    assert second.result["no_new_items"] is True
    assert _events(runtime, second.id) == []


def test_diff_mode_records_new_items_as_an_event(runtime: Runtime) -> None:
    owner = _owner()
    first = run_items(runtime, _items("a", "b"), owner=owner, pipeline="watch2", diff_mode=True)
    second = run_items(runtime, _items("b", "c"), owner=owner, pipeline="watch2", diff_mode=True)

    [event] = _events(runtime, second.id)
    assert event.kind == "new_items"
    assert event.data == {
        "counts": {"new": 1, "removed": 1, "unchanged": 1},
        "previous_job_id": str(first.id),
    }


def test_without_diff_mode_no_event_is_recorded(runtime: Runtime) -> None:
    job = run_items(runtime, _items("a"), owner=_owner(), pipeline="plain")
    assert _events(runtime, job.id) == []
    assert "no_new_items" not in job.result


def test_deleting_a_job_deletes_its_items(runtime: Runtime) -> None:
    job = run_items(runtime, _items("a", "b"), owner=_owner(), pipeline="gone")
    with unit_of_work(runtime.sessions) as session:
        session.delete(session.get(JobRow, job.id))
    with unit_of_work(runtime.sessions) as session:
        left = session.scalars(select(ResultItemRow).where(ResultItemRow.job_id == job.id))
        assert list(left) == []


def test_an_empty_key_is_a_key_like_any_other(runtime: Runtime) -> None:
    job = run_items(runtime, _items("", "a", "b"), owner=_owner(), pipeline="empty-key")
    assert _all_pages(runtime, job, DiffKind.NEW, 1) == ["", "a", "b"]


def test_counts_follow_the_pages_once_the_previous_run_is_deleted(runtime: Runtime) -> None:
    owner = _owner()
    first = run_items(runtime, _items("a", "b"), owner=owner, pipeline="pruned")
    second = run_items(runtime, _items("b", "c"), owner=owner, pipeline="pruned")
    with unit_of_work(runtime.sessions) as session:
        session.delete(session.get(JobRow, first.id))
    with unit_of_work(runtime.sessions) as session:
        job = session.get(JobRow, second.id)
        assert job is not None and job.previous_job_id is None
        assert diff_counts(session, job).as_dict() == {"new": 2, "removed": 0, "unchanged": 0}
    assert _all_pages(runtime, job, DiffKind.NEW, 10) == ["b", "c"]
