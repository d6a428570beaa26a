"""Step logs in PostgreSQL: each attempt's lines, written together once it has run, with the
job, step, shard, attempt and round they belong to; failed attempts keep theirs, a silent
step writes nothing, and a reader pages through them by cursor."""

import dataclasses
import threading
import time
import uuid
from datetime import UTC
from typing import Any

import psycopg
import pytest

from service.engine.jobs import cancel_job
from service.engine.lanes import run_lane
from service.engine.runner import run_step
from service.engine.runtime import Runtime
from service.engine.shards import FannedOut
from service.engine.steplogs import LogLine, Said, keep_lines, read_lines, write_lines
from service.engine.steps import StepKey
from service.platform.capture import Line
from service.platform.clock import utcnow
from service.platform.db import DirectConnections, libpq_url, unit_of_work
from service.platform.errors import RetryLater, StopChain
from tests.support.fanouts import submitted
from tests.support.locks import wait_for_a_lock_waiter


def _chatty(**with_: Any) -> dict[str, Any]:
    return {
        "name": "chatty",
        "steps": [
            {
                "id": "talk",
                "action": "drill.chatter",
                "with": with_,
                "retry": {"attempts": 3, "backoff_s": 0, "jitter": 0},
            }
        ],
    }


def _lines(rt: Runtime, job_id: uuid.UUID, **filters: Any) -> list[LogLine]:
    with unit_of_work(rt.sessions) as session:
        return read_lines(session, job_id, limit=1000, **filters)


def test_a_step_keeps_what_it_logged_and_printed_with_its_attempt(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    job_id = submitted(runtime, _chatty(lines=2), {})
    leftovers.append(job_id)

    run_step(runtime, StepKey(job_id, "talk"), task_id=uuid.uuid4().hex)

    lines = _lines(runtime, job_id, step_id="talk")
    assert [(line.level, line.logger, line.message) for line in lines] == [
        ("INFO", "flowbeat.step", "ctx line 1 of attempt 1"),
        ("WARNING", "tests.drill_actions", "logger line 1"),
        ("INFO", "stdout", "printed line 1"),
        ("INFO", "flowbeat.step", "ctx line 2 of attempt 1"),
        ("WARNING", "tests.drill_actions", "logger line 2"),
        ("INFO", "stdout", "printed line 2"),
    ]
    assert {(line.step_id, line.shard, line.attempt, line.round) for line in lines} == {
        ("talk", None, 1, 1)
    }
    assert [line.seq for line in lines] == [1, 2, 3, 4, 5, 6]
    assert all(
        line.ts.tzinfo is not None and line.ts.utcoffset() == UTC.utcoffset(None) for line in lines
    )


def test_failed_attempts_keep_their_lines_and_a_reader_can_ask_for_one_attempt(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    job_id = submitted(runtime, _chatty(fail_attempts=1), {})
    leftovers.append(job_id)
    key = StepKey(job_id, "talk")

    with pytest.raises(RetryLater):
        run_step(runtime, key, task_id=uuid.uuid4().hex)
    run_step(runtime, key, task_id=uuid.uuid4().hex)

    assert [line.attempt for line in _lines(runtime, job_id)] == [1, 1, 1, 2, 2, 2]
    second = _lines(runtime, job_id, step_id="talk", attempt=2)
    assert [line.message for line in second] == [
        "ctx line 1 of attempt 2",
        "logger line 1",
        "printed line 1",
    ]


def test_an_attempt_is_cut_at_the_configured_size_and_says_so(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    capped = dataclasses.replace(
        runtime, settings=runtime.settings.model_copy(update={"step_log_max_bytes": 40})
    )
    job_id = submitted(capped, _chatty(lines=10), {})
    leftovers.append(job_id)

    run_step(capped, StepKey(job_id, "talk"), task_id=uuid.uuid4().hex)

    lines = _lines(capped, job_id)
    assert sum(len(line.message.encode()) for line in lines[:-1]) == 40
    assert lines[-1].message.startswith("log cut at 40 bytes (FLOWBEAT_STEP_LOG_MAX_BYTES);")


def test_shards_of_a_fan_out_keep_their_lines_under_their_own_shard(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    profile = {
        "name": "chatty-fan",
        "params": {"items": {"type": "array"}},
        "steps": [
            {
                "id": "each",
                "action": "drill.chatter",
                "for_each": {"items": "${{ params.items }}", "max_parallel": 1},
                "with": {"lines": "${{ item }}"},
            }
        ],
    }
    job_id = submitted(runtime, profile, {"items": [1, 2]})
    leftovers.append(job_id)
    key = StepKey(job_id, "each")
    assert isinstance(run_step(runtime, key, task_id=uuid.uuid4().hex), FannedOut)

    run_lane(runtime, key, task_id=uuid.uuid4().hex, slice_s=60)

    shards = [line.shard for line in _lines(runtime, job_id, step_id="each")]
    assert shards == [0] * 3 + [1] * 6


def test_a_reader_pages_through_the_lines_by_cursor(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    job_id = submitted(runtime, _chatty(lines=3), {})
    leftovers.append(job_id)
    run_step(runtime, StepKey(job_id, "talk"), task_id=uuid.uuid4().hex)
    every = _lines(runtime, job_id)

    pages, after = [], 0
    while True:
        with unit_of_work(runtime.sessions) as session:
            page = read_lines(session, job_id, step_id="talk", after=after, limit=4)
        if not page:
            break
        pages.append(page)
        after = page[-1].id

    assert [len(page) for page in pages] == [4, 4, 1]
    assert [line for page in pages for line in page] == every


def test_an_attempt_that_said_nothing_sends_no_statement() -> None:
    """Nowhere to connect to: a statement would fail the call."""
    unreachable = DirectConnections("postgresql+psycopg://nobody@127.0.0.1:1/none")
    keep_lines(unreachable, [Said(StepKey(uuid.uuid4(), "quiet"), 1, [])])


def test_each_round_of_a_loop_keeps_its_lines_under_its_round(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    """A loop's step starts its attempts over each round, so the round tells them apart."""
    looped = {
        "name": "chatty-loop",
        "loops": [
            {
                "steps": ["talk"],
                "until": "${{ steps.talk.output.lines }} > 5",
                "max_rounds": 3,
                "on_exhausted": "continue",
            }
        ],
        "steps": [{"id": "talk", "action": "drill.chatter"}],
    }
    job_id = submitted(runtime, looped, {})
    leftovers.append(job_id)

    for _ in range(3):
        run_step(runtime, StepKey(job_id, "talk"), task_id=uuid.uuid4().hex)

    lines = _lines(runtime, job_id)
    assert [(line.round, line.attempt) for line in lines] == [
        (round_, 1) for round_ in (1, 2, 3) for _ in range(3)
    ]


@pytest.mark.e2e  # waits for the lease renewal thread to notice the cancel
def test_an_attempt_stopped_by_a_cancel_keeps_what_it_said_until_then(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    job_id = submitted(runtime, _chatty(lines=200, hold_s=0.05), {})
    leftovers.append(job_id)
    stopped: list[BaseException] = []

    def attempt() -> None:
        try:
            run_step(runtime, StepKey(job_id, "talk"), task_id=uuid.uuid4().hex)
        except StopChain as exc:
            stopped.append(exc)

    running = threading.Thread(target=attempt)
    running.start()
    time.sleep(0.5)
    with unit_of_work(runtime.sessions) as session:
        cancel_job(session, job_id, owner=None, now=utcnow())
    running.join(timeout=30)

    lines = _lines(runtime, job_id)
    assert stopped, "the attempt was stopped, not run to its end"
    assert 3 <= len(lines) < 600
    assert lines[0].message == "ctx line 1 of attempt 1"


def test_two_attempts_of_a_job_writing_at_once_commit_in_the_order_of_their_ids(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    """A follower's cursor is the line id: a write that took smaller ids and committed later
    would be skipped. The second write waits for the first to commit before it takes any."""
    job_id = submitted(runtime, _chatty(), {})
    leftovers.append(job_id)
    said = [Line(1, "INFO", "stdout", time.time(), "said")]
    conninfo = libpq_url(runtime.settings.require_database_url())

    with psycopg.connect(conninfo) as first:
        write_lines(first, [Said(StepKey(job_id, "talk", 0), 1, said)])
        second = threading.Thread(
            target=keep_lines, args=(runtime.claims, [Said(StepKey(job_id, "talk", 1), 1, said)])
        )
        second.start()
        wait_for_a_lock_waiter(runtime, "the second write, behind the first,")
        first.commit()
    second.join(timeout=10)

    lines = _lines(runtime, job_id)
    assert [line.shard for line in lines] == [0, 1]
    assert lines[0].id < lines[1].id


def test_a_custom_level_with_a_long_name_is_kept_cut_to_the_column(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    job_id = submitted(runtime, _chatty(), {})
    leftovers.append(job_id)
    said = [Line(1, "VERY_VERBOSE_DIAGNOSTICS", "lib", time.time(), "detail")]

    keep_lines(runtime.claims, [Said(StepKey(job_id, "talk"), 1, said)])

    assert [line.level for line in _lines(runtime, job_id)] == ["VERY_VERBOSE_DIA"]
