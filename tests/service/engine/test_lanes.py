"""A lane takes short shards in batches: one statement checkpoints a batch and takes the next,
one more writes the lines its shards logged, each shard keeps the times of its own attempt, a
shard that fails has those before it checkpointed and those after it given back, and the
batch's lease is renewed whole."""

import itertools
import threading
import time
import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from service.engine import lanes, steplogs
from service.engine.checkpoints import complete_shards_and_take
from service.engine.claims import fast_shard_claims
from service.engine.jobs import cancel_job
from service.engine.lanes import run_lane
from service.engine.leases import renew_lease
from service.engine.runner import run_step
from service.engine.runtime import Runtime
from service.engine.shards import FannedOut
from service.engine.steplogs import LogLine, Said, read_lines
from service.engine.steps import Flushed, ShardDone, StepKey
from service.platform.clock import utcnow
from service.platform.db import unit_of_work
from service.platform.errors import RetryLater, StopChain
from service.platform.models import StepRunRow
from tests.support.fanouts import fan_profile, submitted


@pytest.fixture
def batches(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The shards of each batch the lanes checkpoint, the statement run as it is; and a pace
    that fills every batch, so the sizes do not depend on this machine's speed."""
    seen: list[list[int]] = []

    def spied(
        conn: Any, parent: StepKey, batch: Sequence[ShardDone], *a: Any, **kw: Any
    ) -> Flushed:
        seen.append([done.key.shard for done in batch])
        return complete_shards_and_take(conn, parent, batch, *a, **kw)

    monkeypatch.setattr(lanes, "complete_shards_and_take", spied)
    monkeypatch.setattr(lanes, "LANE_BATCH_S", 3600.0)
    return seen


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The shards whose lines each statement of step logs wrote, the statement run as it is."""
    seen: list[list[int]] = []
    write = steplogs.write_lines

    def spied(conn: Any, said: Sequence[Said]) -> None:
        seen.append([one.key.shard for one in said if one.lines])
        write(conn, said)

    monkeypatch.setattr(steplogs, "write_lines", spied)
    return seen


def _chatty(rt: Runtime, fail_attempts: list[int]) -> StepKey:
    """Shards that each say three lines, and fail as many first attempts as their item says."""
    return _fanned_out(
        rt,
        fail_attempts,
        action="drill.chatter",
        retry={"attempts": 2, "backoff_s": 0, "jitter": 0},
        **{"with": {"fail_attempts": "${{ item }}"}},
    )


def _said(rt: Runtime, key: StepKey) -> list[LogLine]:
    with rt.sessions() as session:
        return read_lines(session, key.job_id, limit=1000)


def _fanned_out(rt: Runtime, items: list[Any], **step: Any) -> StepKey:
    profile = fan_profile()
    profile["steps"][0] |= step
    key = StepKey(submitted(rt, profile, {"items": items}), "each")
    assert isinstance(run_step(rt, key, task_id=uuid.uuid4().hex), FannedOut)
    return key


def _shards(rt: Runtime, key: StepKey) -> list[StepRunRow]:
    with rt.sessions() as session:
        rows = session.scalars(
            select(StepRunRow)
            .where(StepRunRow.job_id == key.job_id, StepRunRow.shard >= 0)
            .order_by(StepRunRow.shard)
        )
        return list(rows)


def test_short_shards_are_checkpointed_a_batch_a_statement(
    runtime: Runtime, batches: list[list[int]], leftovers: list[uuid.UUID]
) -> None:
    key = _fanned_out(runtime, list(range(40)))
    leftovers.append(key.job_id)

    assert run_lane(runtime, key, task_id=uuid.uuid4().hex, slice_s=60) is False

    assert [len(batch) for batch in batches] == [1, 32, 7]
    with runtime.sessions() as session:
        outputs = session.execute(
            select(StepRunRow.shard, StepRunRow.output).where(
                StepRunRow.job_id == key.job_id,
                StepRunRow.output.is_not(None),
                StepRunRow.shard >= 0,
            )
        )
        assert {shard: output for shard, output in outputs} == {n: {"item": n} for n in range(40)}
    assert {row.status for row in _shards(runtime, key)} == {"succeeded"}


def test_the_lines_a_batch_of_shards_logged_are_written_in_one_statement(
    runtime: Runtime,
    batches: list[list[int]],
    writes: list[list[int]],
    leftovers: list[uuid.UUID],
) -> None:
    key = _chatty(runtime, [0] * 40)
    leftovers.append(key.job_id)

    run_lane(runtime, key, task_id=uuid.uuid4().hex, slice_s=60)

    assert [len(batch) for batch in batches] == [1, 32, 7]
    assert writes == batches
    lines = _said(runtime, key)
    assert [line.shard for line in lines] == [shard for shard in range(40) for _ in range(3)]
    assert {(line.attempt, line.round) for line in lines} == {(1, 1)}


def test_a_shard_that_fails_in_a_batch_keeps_its_lines_with_those_before_it(
    runtime: Runtime,
    batches: list[list[int]],
    writes: list[list[int]],
    leftovers: list[uuid.UUID],
) -> None:
    key = _chatty(runtime, [0, 0, 0, 1, 0])
    leftovers.append(key.job_id)

    with pytest.raises(RetryLater):
        run_lane(runtime, key, task_id=uuid.uuid4().hex, slice_s=60)

    assert batches == [[0], [1, 2]]
    assert writes == [[0], [1, 2, 3]]
    lines = _said(runtime, key)
    assert [line.shard for line in lines] == [shard for shard in range(4) for _ in range(3)]
    assert lines[-1].message == "printed line 1"


def test_a_batch_stopped_by_a_cancel_keeps_what_its_shards_said_until_then(
    runtime: Runtime,
    batches: list[list[int]],
    writes: list[list[int]],
    leftovers: list[uuid.UUID],
) -> None:
    """The last shard says a line every 50 ms for 10 s; the job is cancelled once the first
    batch is checkpointed, while the second runs."""
    key = _fanned_out(
        runtime,
        [1, 1, 1, 200],
        action="drill.chatter",
        **{"with": {"lines": "${{ item }}", "hold_s": 0.05}},
    )
    leftovers.append(key.job_id)
    stopped: list[StopChain] = []

    def lane() -> None:
        try:
            run_lane(runtime, key, task_id=uuid.uuid4().hex, slice_s=60)
        except StopChain as exc:
            stopped.append(exc)

    running = threading.Thread(target=lane)
    running.start()
    deadline = time.monotonic() + 10
    while _shards(runtime, key)[0].status != "succeeded":
        assert time.monotonic() < deadline, "the first batch was checkpointed"
        time.sleep(0.01)
    with unit_of_work(runtime.sessions) as session:
        cancel_job(session, key.job_id, owner=None, now=utcnow())
    running.join(timeout=30)

    assert stopped, "the batch was stopped, not run to its end"
    assert batches == [[0]]
    assert len(writes) == 2 and writes[0] == [0] and writes[1][0] == 1
    shards = [line.shard for line in _said(runtime, key) if line.shard is not None]
    assert shards[:3] == [0, 0, 0] and shards == sorted(shards)
    assert set(shards) == {0, *writes[1]} and len(shards) < 3 * 203


def test_each_shard_of_a_batch_keeps_the_times_of_its_own_attempt(
    runtime: Runtime, batches: list[list[int]], leftovers: list[uuid.UUID]
) -> None:
    key = _fanned_out(runtime, list(range(12)))
    leftovers.append(key.job_id)

    run_lane(runtime, key, task_id=uuid.uuid4().hex, slice_s=60)

    rows = _shards(runtime, key)
    assert max(len(batch) for batch in batches) > 1
    for before, after in itertools.pairwise(rows):
        assert before.started_at and before.finished_at and after.started_at
        assert before.started_at <= before.finished_at <= after.started_at


def test_a_shard_that_fails_has_the_batch_before_it_checkpointed_and_after_it_given_back(
    runtime: Runtime, batches: list[list[int]], leftovers: list[uuid.UUID]
) -> None:
    """Items succeed on the attempt their value names: the item 9 fails its first."""
    items = [1] * 5 + [9] + [1] * 5
    key = _fanned_out(
        runtime,
        items,
        action="fail",
        retry={"attempts": 2, "backoff_s": 0, "jitter": 0},
        **{"with": {"succeed_on_attempt": "${{ item }}"}},
    )
    leftovers.append(key.job_id)

    with pytest.raises(RetryLater):
        run_lane(runtime, key, task_id=uuid.uuid4().hex, slice_s=60)

    assert batches == [[0], [1, 2, 3, 4]]
    rows = _shards(runtime, key)
    assert [row.status for row in rows[:5]] == ["succeeded"] * 5
    assert rows[5].status == "retrying"
    assert all(row.lease_token is None and row.attempts == 0 for row in rows[6:])
    assert all(row.status == "running" for row in rows[6:])


def test_a_batch_keeps_its_lease_whole_while_one_of_its_shards_runs(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    key = _fanned_out(runtime, list(range(4)))
    leftovers.append(key.job_id)
    soon = utcnow()
    with runtime.claims.connect() as conn:
        held = fast_shard_claims(conn, key, take=3, task_id="lane", lease_s=5, now=soon)
    running = held[1]

    with unit_of_work(runtime.sessions) as session:
        assert renew_lease(session, running.key, running.lease, 600, soon)

    leases = {row.shard: row.lease_until for row in _shards(runtime, key)}
    renewed = [leases[shard] for shard in (0, 1, 2)]
    assert all(until and until > soon + timedelta(seconds=500) for until in renewed)
    assert leases[3] is None


def test_a_shard_taken_away_is_not_renewed_by_its_batch(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    key = _fanned_out(runtime, list(range(3)))
    leftovers.append(key.job_id)
    with runtime.claims.connect() as conn:
        held = fast_shard_claims(conn, key, take=3, task_id="lane", lease_s=5, now=utcnow())
        conn.execute(
            "UPDATE step_runs SET lease_token = 'another-lane'"
            " WHERE job_id = %s AND step_id = 'each' AND shard = 2",
            (key.job_id,),
        )

    with unit_of_work(runtime.sessions) as session:
        assert not renew_lease(session, held[2].key, held[2].lease, 600, utcnow())
        assert renew_lease(session, held[0].key, held[0].lease, 600, utcnow())


def test_a_step_that_caches_its_output_takes_its_shards_one_at_a_time(
    runtime: Runtime, batches: list[list[int]], leftovers: list[uuid.UUID]
) -> None:
    """Its checkpoint writes the shard's row of the step cache in the same statement."""
    key = _fanned_out(runtime, list(range(6)), cache={"ttl_s": 3600})
    leftovers.append(key.job_id)

    assert run_lane(runtime, key, task_id=uuid.uuid4().hex, slice_s=60) is False

    assert batches == []
    assert {row.status for row in _shards(runtime, key)} == {"succeeded"}
