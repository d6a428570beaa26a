"""The shapes a step's run hands from module to module: what a claim took (``FastClaim``,
``ShardClaim``), what it became (work ``Claimed``, a fan-out due, a failure or a skip), and what
its checkpoint did (``Completion``). They live apart from the code that makes them so that the
claim, the attempt and the record can each name them without importing one another.
"""

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from service.language.plan import JobPlan
from service.language.profiles import Profile
from service.language.specs import RetryPolicy, StepSpec
from service.platform.constants import SHARD_NONE
from service.platform.models import JobRow, StepRunRow


@dataclass(frozen=True)
class StepKey:
    job_id: uuid.UUID
    step_id: str
    shard: int = SHARD_NONE


@dataclass(frozen=True)
class Lease:
    token: str
    attempt: int
    batch: tuple[int, ...] = ()
    """Every shard a lane took with this one under the same token (``lanes``): the lease of a
    shard's attempt is renewed and released for the whole batch, so a shard that ran and waits
    for the batch's checkpoint keeps its lease while the shards after it run."""


@dataclass(frozen=True)
class FastClaim:
    """A step the claim statement took, with what it read: the job's profile and params, and
    the outputs of the steps its inputs read."""

    lease: Lease
    profile: Profile
    params: dict[str, Any]
    outputs: dict[str, Any]


@dataclass(frozen=True)
class ShardClaim:
    """A shard a lane's claim statement took, with its item and the outputs its inputs read."""

    key: StepKey
    lease: Lease
    profile: Profile
    item: Any
    outputs: dict[str, Any]

    @classmethod
    def batch(
        cls,
        parent: StepKey,
        token: str,
        profile: Profile,
        rows: Sequence[tuple[int, int, Any, dict[str, Any]]],
    ) -> list["ShardClaim"]:
        """The shards one statement took under ``token``, from their (shard, attempts, item,
        outputs): the lease of each names the whole batch when there are several."""
        batch = tuple(shard for shard, *_ in rows) if len(rows) > 1 else ()
        return [
            cls(
                StepKey(parent.job_id, parent.step_id, shard),
                Lease(token, attempts, batch),
                profile,
                item,
                outputs,
            )
            for shard, attempts, item, outputs in rows
        ]


@dataclass(frozen=True)
class Claimed:
    """A step this worker now holds: run ``action`` with ``inputs``."""

    key: StepKey
    lease: Lease
    action: str
    inputs: dict[str, Any]
    params: dict[str, Any]
    retry: RetryPolicy
    sink: bool
    profile: Profile
    trigger: dict[str, Any] = field(default_factory=dict)
    """What ``trigger.*`` reads, loaded for a step that reads it (its verify rules too)."""
    secret_nonce: str | None = None
    """Set when ``inputs`` hold secret marks (``expressions.secret_mark``) to reveal."""


@dataclass(frozen=True)
class Unresolvable:
    """The step's references cannot resolve; it was failed for good in the same transaction."""

    key: StepKey
    job_over: bool
    ready: JobPlan


@dataclass(frozen=True)
class Skipped:
    """The step settled without running (its upstream rule said so); send ``ready`` next."""

    key: StepKey
    ready: JobPlan


@dataclass(frozen=True)
class Woke:
    """A wait step settled at its claim, its time having passed already; send ``ready`` next."""

    key: StepKey
    ready: JobPlan


@dataclass(frozen=True)
class Completion:
    """A checkpointed attempt: whether it was written, the children it made ready, and the
    trigger of the job it succeeded, if it did. ``taken`` is the child the same statement
    claimed for this worker to run next (``Follow``); it is not in ``ready``."""

    written: bool
    ready: JobPlan
    succeeded_trigger: str | None = None
    taken: "Taken | None" = None
    next_shard: ShardClaim | None = None
    """For a shard's checkpoint, the lane's next shard that the same statement took."""


@dataclass(frozen=True)
class ShardDone:
    """A shard a lane ran whose output waits for its batch's checkpoint: a lane checkpoints
    the shards it took together in one statement once all have run
    (``checkpoints.complete_shards_and_take``)."""

    key: StepKey
    lease: Lease
    output: Any
    started_at: datetime
    finished_at: datetime


@dataclass(frozen=True)
class Flushed:
    """A lane's batch checkpointed: how many of its shards were written (a shard whose lease
    was lost is not), and the next shards the same statement took for the lane."""

    written: int
    taken: list[ShardClaim]


@dataclass(frozen=True)
class CacheWrite:
    """What the checkpoint of a step that declares ``cache`` writes to ``step_cache`` in its
    own statement: an entry under ``key`` when the step ran its action, or, with ``source``
    (job, step, shard), a use: the step took that entry's output and settles ``cached``."""

    owner: str
    key: str
    source: tuple[uuid.UUID, str, int] | None = None


@dataclass(frozen=True)
class Taken:
    """The child a checkpoint claimed (``Follow``), and the outputs its inputs read."""

    key: StepKey
    lease: Lease
    outputs: dict[str, Any]


@dataclass(frozen=True)
class Follow:
    """Claim ``step_id``, a child whose only upstream is the step being checkpointed, in the
    checkpoint's statement, for the same worker to run next without a message."""

    step_id: str
    task_id: str
    lease_s: float


@dataclass(frozen=True)
class FanOutDue:
    """A for_each step this transaction holds; ``shards.fan_out`` records its shards before the
    transaction ends, on the rows locked here."""

    job: JobRow
    row: StepRunRow
    spec: StepSpec
