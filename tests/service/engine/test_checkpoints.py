"""A shard's checkpoint, or a lane's batch of them, takes the lane's next shards in its own
statement, and only when the checkpoint itself is written."""

import uuid

from sqlalchemy import select

from service.engine.checkpoints import complete_shard_and_take, complete_shards_and_take
from service.engine.claims import fast_shard_claims
from service.engine.runner import run_step
from service.engine.runtime import Runtime
from service.engine.shards import FannedOut
from service.engine.steps import Lease, ShardClaim, ShardDone, StepKey
from service.platform.clock import utcnow
from service.platform.models import StepRunRow
from tests.support.fanouts import fan_profile, submitted


def _first_shards(rt: Runtime, items: int, take: int = 1) -> list[ShardClaim]:
    parent = StepKey(
        submitted(rt, fan_profile("${{ item }}"), {"items": list(range(items))}), "each"
    )
    assert isinstance(run_step(rt, parent, task_id=uuid.uuid4().hex), FannedOut)
    with rt.claims.connect() as conn:
        claims = fast_shard_claims(
            conn, parent, take=take, task_id="lane", lease_s=60, now=utcnow()
        )
    assert [claim.key.shard for claim in claims] == list(range(take))
    assert len({claim.lease.token for claim in claims}) == 1
    return claims


def _first_shard(rt: Runtime, items: int) -> ShardClaim:
    (claim,) = _first_shards(rt, items)
    return claim


def _shards(rt: Runtime, job_id: uuid.UUID) -> dict[int, tuple[str, str | None]]:
    with rt.sessions() as session:
        rows = session.execute(
            select(StepRunRow.shard, StepRunRow.status, StepRunRow.lease_token).where(
                StepRunRow.job_id == job_id, StepRunRow.shard >= 0
            )
        )
        return {shard: (status, token) for shard, status, token in rows}


def _take(rt: Runtime, claim: ShardClaim, lease: Lease) -> tuple[bool, ShardClaim | None]:
    with rt.checkpoints.connect() as conn:
        done = complete_shard_and_take(
            conn,
            claim.key,
            lease,
            {"n": 0},
            utcnow(),
            profile=claim.profile,
            task_id="lane",
            lease_s=60,
        )
    return done.written, done.next_shard


def test_a_shards_checkpoint_takes_the_next_open_shard_under_a_lease_of_its_own(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    first = _first_shard(runtime, 3)
    leftovers.append(first.key.job_id)

    written, taken = _take(runtime, first, first.lease)

    assert written and taken is not None
    assert taken.key == StepKey(first.key.job_id, "each", 1) and taken.item == 1
    shards = _shards(runtime, first.key.job_id)
    assert shards[0] == ("succeeded", None)
    assert shards[1] == ("running", taken.lease.token)
    assert shards[2] == ("pending", None)
    with runtime.sessions() as session:
        row = session.get(StepRunRow, (first.key.job_id, "each", 0))
        assert row is not None and row.output is not None


def test_a_checkpoint_that_lost_its_lease_takes_no_shard(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    first = _first_shard(runtime, 2)
    leftovers.append(first.key.job_id)

    written, taken = _take(runtime, first, Lease("not-the-holder", first.lease.attempt))

    assert not written and taken is None
    assert _shards(runtime, first.key.job_id)[1] == ("pending", None)


def test_the_last_shards_checkpoint_takes_nothing(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    first = _first_shard(runtime, 1)
    leftovers.append(first.key.job_id)

    written, taken = _take(runtime, first, first.lease)

    assert written and taken is None


def test_a_batch_writes_the_shards_it_still_holds_and_takes_the_next_beyond_its_own(
    runtime: Runtime, leftovers: list[uuid.UUID]
) -> None:
    held = _first_shards(runtime, 6, take=3)
    job_id = held[0].key.job_id
    leftovers.append(job_id)
    with runtime.sessions() as session, session.begin():
        row = session.get(StepRunRow, (job_id, "each", 1))
        assert row is not None
        row.lease_token = "another-lane"
    now = utcnow()
    ran = [ShardDone(claim.key, claim.lease, {"n": claim.key.shard}, now, now) for claim in held]

    with runtime.checkpoints.connect() as conn:
        parent = StepKey(job_id, "each")
        flushed = complete_shards_and_take(
            conn, parent, ran, now, take=5, profile=held[0].profile, task_id="lane", lease_s=60
        )

    assert flushed.written == 2
    assert [claim.key.shard for claim in flushed.taken] == [3, 4, 5]
    shards = _shards(runtime, job_id)
    assert shards[0][0] == shards[2][0] == "succeeded"
    assert shards[1] == ("running", "another-lane")
    with runtime.sessions() as session:
        written = session.scalars(
            select(StepRunRow.shard).where(
                StepRunRow.job_id == job_id, StepRunRow.output.is_not(None)
            )
        )
        assert sorted(written) == [0, 2]
