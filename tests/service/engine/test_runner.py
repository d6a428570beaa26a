"""Running steps in a worker: a lane takes shards until its time slice is used up, and an
attempt cut short before its outcome is recorded gives its lease back."""

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError

from service.engine.jobs import cancel_job
from service.engine.lanes import run_lane
from service.engine.runner import run_finish_fanout, run_step
from service.engine.runtime import Runtime
from service.engine.shards import FannedOut
from service.engine.steps import StepKey
from service.language.plan import JobPlan
from service.platform.clock import utcnow
from service.platform.db import DirectConnections, ping, unit_of_work
from service.platform.errors import RetryLater, StopChain
from service.platform.metrics import registry
from service.platform.models import JobRow, StepRunRow
from tests.drill_actions import cut_in_flight, drop_connections, named_connections
from tests.support.fanouts import fan_profile, submitted

ITEMS = 5


def fanned_out(rt: Runtime, items: int = ITEMS, uses: str = "${{ item }}") -> StepKey:
    key = StepKey(submitted(rt, fan_profile(uses), {"items": list(range(items))}), "each")
    assert isinstance(run_step(rt, key, task_id=uuid.uuid4().hex), FannedOut)
    return key


def shards_done(rt: Runtime, key: StepKey) -> int:
    with rt.sessions() as session:
        done = session.scalar(
            select(func.count()).where(
                StepRunRow.job_id == key.job_id,
                StepRunRow.step_id == key.step_id,
                StepRunRow.shard >= 0,
                StepRunRow.status == "succeeded",
            )
        )
    return done or 0


def test_a_used_up_slice_hands_the_lane_on_after_one_shard(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    key = fanned_out(runtime)
    leftovers.append(key.job_id)

    assert run_lane(runtime, key, task_id=uuid.uuid4().hex, slice_s=0) is True
    assert shards_done(runtime, key) == 1
    with runtime.sessions() as session:
        held = session.scalar(
            select(func.count()).where(
                StepRunRow.job_id == key.job_id,
                StepRunRow.shard >= 0,
                StepRunRow.lease_token.is_not(None),
            )
        )
    assert held == 0, "the lane handed on takes no shard it will not run"


def test_a_lane_runs_short_shards_in_one_message_until_none_is_left(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    key = fanned_out(runtime)
    leftovers.append(key.job_id)

    assert run_lane(runtime, key, task_id=uuid.uuid4().hex, slice_s=60) is False
    assert shards_done(runtime, key) == ITEMS
    assert run_lane(runtime, key, task_id=uuid.uuid4().hex, slice_s=60) is False


def test_the_gathered_output_keeps_item_order_whichever_lane_ran_a_shard(
    runtime: Runtime,
) -> None:
    key = fanned_out(runtime)
    while run_lane(runtime, key, task_id=uuid.uuid4().hex, slice_s=0):
        pass

    run_finish_fanout(runtime, key)

    with runtime.sessions() as session:
        output = session.scalar(
            select(StepRunRow.output).where(
                StepRunRow.job_id == key.job_id,
                StepRunRow.output.is_not(None),
                StepRunRow.step_id == "each",
                StepRunRow.shard == -1,
            )
        )
        job = session.get(JobRow, key.job_id)
    assert output == [{"item": n} for n in range(ITEMS)]
    assert job is not None and job.status == "succeeded"


def test_a_lane_of_a_cancelled_job_stops_its_chain(runtime: Runtime) -> None:
    key = fanned_out(runtime)
    with unit_of_work(runtime.sessions) as session:
        cancel_job(session, key.job_id, owner=None, now=utcnow())

    with pytest.raises(StopChain):
        run_lane(runtime, key, task_id=uuid.uuid4().hex, slice_s=60)
    assert shards_done(runtime, key) == 0


def test_a_shard_whose_inputs_do_not_resolve_fails_the_job(runtime: Runtime) -> None:
    key = fanned_out(runtime, uses="${{ item.missing }}")

    with pytest.raises(StopChain):
        run_lane(runtime, key, task_id=uuid.uuid4().hex, slice_s=60)
    with runtime.sessions() as session:
        shard = session.scalars(
            select(StepRunRow).where(StepRunRow.job_id == key.job_id, StepRunRow.shard == 0)
        ).one()
        job = session.get(JobRow, key.job_id)
    assert shard.status == "failed" and shard.error is not None
    assert job is not None and job.status == "failed"


LONG_LEASE_S = 600.0


@dataclass(frozen=True)
class Worker:
    """A worker whose leases outlast any test, on connections named ``name``. The delivery
    after its cut-short attempt goes to another worker (``runtime``), whose connections live."""

    rt: Runtime
    name: str

    def drop_connections(self) -> None:
        drop_connections(self.rt.settings.require_database_url(), self.name)

    def cut_in_flight(self, lock: str, *params: Any) -> None:
        cut_in_flight(self.rt.settings.require_database_url(), self.name, lock, params)


@pytest.fixture
def worker(runtime: Runtime) -> Iterator[Worker]:
    name = f"runner-test-{uuid.uuid4().hex[:8]}"
    url = named_connections(runtime.settings.require_database_url(), name)
    settings = runtime.settings.model_copy(update={"database_url": url, "lease_s": LONG_LEASE_S})
    rt = Runtime.start(settings)
    yield Worker(rt, name)
    rt.sessions.kw["bind"].dispose()


def connected(direct: DirectConnections) -> None:
    """Open a direct connection now, as a worker that ran steps before holds one already."""
    with direct.connect():
        pass


def dropping_profile(*, fail: bool) -> dict[str, Any]:
    return {
        "name": "drop",
        "steps": [
            {
                "id": "drop",
                "action": "drill.drop_connections",
                "retry": {"attempts": 3, "backoff_s": 0, "jitter": 0},
                "with": {"fail": fail},
            }
        ],
    }


def step_row(rt: Runtime, key: StepKey) -> StepRunRow:
    with rt.sessions() as session:
        return session.scalars(
            select(StepRunRow).where(
                StepRunRow.job_id == key.job_id,
                StepRunRow.step_id == key.step_id,
                StepRunRow.shard == key.shard,
            )
        ).one()


@pytest.mark.parametrize(
    ("fail", "dropped"),
    [(False, psycopg.OperationalError), (True, OperationalError)],
    ids=["its checkpoint", "its failure"],
)
def test_an_attempt_that_could_not_record_its_outcome_gives_its_lease_back(
    runtime: Runtime,
    worker: Worker,
    leftovers: list[uuid.UUID],
    fail: bool,
    dropped: type[Exception],
) -> None:
    """The server ends the statement that records the outcome while it is in flight."""
    key = StepKey(submitted(runtime, dropping_profile(fail=fail), {}), "drop")
    leftovers.append(key.job_id)

    with pytest.raises(dropped):
        run_step(worker.rt, key, task_id=uuid.uuid4().hex)
    assert run_step(runtime, key, task_id=uuid.uuid4().hex) == JobPlan(key.job_id)

    row = step_row(runtime, key)
    assert (row.status, row.attempts) == ("succeeded", 2)


def test_connections_dropped_while_idle_cost_the_next_step_nothing(
    runtime: Runtime, worker: Worker, leftovers: list[uuid.UUID]
) -> None:
    """As after a PostgreSQL restart: each connection the worker holds was ended while idle,
    and is replaced before its next statement, so the step runs and is recorded once."""
    key = StepKey(
        submitted(runtime, {"name": "one", "steps": [{"id": "a", "action": "noop"}]}, {}), "a"
    )
    leftovers.append(key.job_id)
    connected(worker.rt.claims)
    connected(worker.rt.checkpoints)
    ping(worker.rt.sessions)
    worker.drop_connections()

    assert run_step(worker.rt, key, task_id=uuid.uuid4().hex) == JobPlan(key.job_id)

    row = step_row(runtime, key)
    assert (row.status, row.attempts) == ("succeeded", 1)


def test_a_for_each_step_cut_off_before_its_fan_out_gives_its_lease_back(
    runtime: Runtime, worker: Worker, leftovers: list[uuid.UUID]
) -> None:
    """The server ends the statement that records the shards while it is in flight."""
    job_id = submitted(runtime, fan_profile(), {"items": list(range(ITEMS))})
    leftovers.append(job_id)
    worker.cut_in_flight(
        "INSERT INTO step_runs (job_id, step_id, shard, status, attempts, depends_on, inputs_from)"
        " VALUES (%s, 'each', 0, 'pending', 0, '{}', '{}')",
        job_id,
    )

    with pytest.raises(OperationalError):
        run_step(worker.rt, StepKey(job_id, "each"), task_id=uuid.uuid4().hex)
    fanned = run_step(runtime, StepKey(job_id, "each"), task_id=uuid.uuid4().hex)

    assert isinstance(fanned, FannedOut)
    assert fanned.shards == list(range(ITEMS))


def test_a_shard_whose_checkpoint_connection_was_dropped_gives_its_lease_back(
    runtime: Runtime, worker: Worker, leftovers: list[uuid.UUID]
) -> None:
    """The server ends the first shard's checkpoint in flight."""
    profile = fan_profile()
    profile["steps"][0].update({"action": "drill.drop_connections", "with": {}})
    key = StepKey(submitted(runtime, profile, {"items": list(range(ITEMS))}), "each")
    leftovers.append(key.job_id)
    assert isinstance(run_step(runtime, key, task_id=uuid.uuid4().hex), FannedOut)

    with pytest.raises(psycopg.OperationalError):
        run_lane(worker.rt, key, task_id=uuid.uuid4().hex, slice_s=60)
    assert run_lane(runtime, key, task_id=uuid.uuid4().hex, slice_s=60) is False

    assert shards_done(runtime, key) == ITEMS


def test_a_fan_out_item_is_counted_once_however_many_attempts_it_took(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    """Every item fails its first attempt and succeeds its second: three items, six attempts."""
    profile = fan_profile()
    step = profile["steps"][0]
    step["action"] = "fail"
    step["with"] = {"succeed_on_attempt": 2}
    step["retry"] = {"attempts": 2, "backoff_s": 0, "jitter": 0}
    key = StepKey(submitted(runtime, profile, {"items": [1, 2, 3]}), "each")
    leftovers.append(key.job_id)
    assert isinstance(run_step(runtime, key, task_id=uuid.uuid4().hex), FannedOut)
    before = _fanout_items("fail")

    lane_on = True
    while lane_on:
        try:
            lane_on = run_lane(runtime, key, task_id=uuid.uuid4().hex, slice_s=60)
        except RetryLater:
            lane_on = True

    assert shards_done(runtime, key) == 3
    assert _fanout_items("fail") - before == 3


def _fanout_items(action: str) -> float:
    value = registry().get_sample_value("flowbeat_fanout_items_total", {"action": action})
    return value or 0.0


def test_a_job_its_sink_succeeds_is_counted_finished_by_pipeline_and_trigger(
    runtime: Runtime,
) -> None:
    profile = {"name": "solo", "steps": [{"id": "only", "action": "noop"}]}
    key = StepKey(submitted(runtime, profile, {}), "only")
    series = {"pipeline": "solo", "trigger": "api", "status": "succeeded"}
    before = registry().get_sample_value("flowbeat_jobs_finished_total", series) or 0.0

    run_step(runtime, key, task_id=uuid.uuid4().hex)

    with runtime.sessions() as session:
        job = session.get(JobRow, key.job_id)
        assert job is not None and job.status == "succeeded"
    assert registry().get_sample_value("flowbeat_jobs_finished_total", series) == before + 1
