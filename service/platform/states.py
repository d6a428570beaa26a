"""Every job, step and compensation status, and every transition between them, in one table.

The engine's functions each carry out a row of these tables in one statement or one
transaction; a new execution pattern adds rows here rather than branches to the runner.
PostgreSQL holds the same rows (``lifecycle_transitions``, written from here at every
migration) and a trigger refuses any status written that they do not allow, so code that
drifts from the table fails where it runs, not in review. ``tests/service/platform/test_states.py``
walks the tables: every status reachable, every open status with a way out, every transition
carried out by a function that exists.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    AWAITING_APPROVAL = "awaiting_approval"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class StepStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    RETRYING = "retrying"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"
    REUSED = "reused"
    CACHED = "cached"
    """It took the output of a succeeded step of the same owner whose action ran with the same
    inputs within its ``cache.ttl_s``, instead of running (``service.engine.stepcache``)."""
    AWAITING_APPROVAL = "awaiting_approval"
    REJECTED = "rejected"
    AWAITING_SLOT = "awaiting_slot"
    """Its concurrency key had no slot free: it holds no lease and no message until the beat
    lets it in (``service.engine.slots``)."""
    SLEEPING = "sleeping"
    """A ``wait`` step parked until its ``wake_at``: no lease, no message, only a row."""
    AWAITING_SIGNAL = "awaiting_signal"
    """Its ``wait_for`` signal has not arrived: it holds no lease and no message until the
    signal, or its timeout, sends it again (``service.engine.signals``)."""
    AWAITING_RATE = "awaiting_rate"
    """Its rate-limit key had no room in its window: it holds no lease and no message until the
    beat leader lets it in once the window has room (``service.engine.rates``)."""
    AWAITING_CHILD = "awaiting_child"
    """A ``pipeline.run`` step whose child job the beat leader starts and, with ``wait: true``,
    waits for: no lease, no message, until the child ends (``service.engine.children``)."""


class CompensationStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPENSATED = "compensated"
    FAILED = "compensation_failed"


class ApprovalStatus(StrEnum):
    PENDING = "pending"
    ESCALATED = "escalated"
    APPROVED = "approved"
    REJECTED = "rejected"


class ParkReason(StrEnum):
    """What a claimed step parks for (``service.engine.parking``), in the order it meets them."""

    APPROVAL = "approval"
    SIGNAL = "signal"
    SLOT = "slot"
    TIMER = "timer"
    CHILD = "child"


def sql_in(statuses: Iterable[StrEnum]) -> str:
    """A parenthesised SQL list of status literals, for statements written as text: the
    statuses they name come from the enums, never typed twice."""
    return "(" + ", ".join(f"'{status.value}'" for status in statuses) + ")"


def row_test(condition: str) -> str:
    """``condition`` on a row a statement finds by its key, written so that no index serves it.

    Beside ``id = %(job_id)s``, a status test matches the partial indexes of open jobs, and
    statistics taken while few jobs were open make such an index look nearly empty: PostgreSQL
    then reads it whole rather than the primary key, for every step, until the next
    ``ANALYZE``. ``IS TRUE`` keeps the test's meaning in a ``WHERE`` clause (a null still
    fails it) and hides it from index matching. Measured with 50,000 queued jobs after an
    ``ANALYZE`` that saw none: 17 ms a step's statement through that index, 0.3 ms by key."""
    return f"({condition}) IS TRUE"


JOB_FINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})
STEP_FINAL = frozenset(
    {
        StepStatus.SUCCEEDED,
        StepStatus.FAILED,
        StepStatus.SKIPPED,
        StepStatus.CANCELLED,
        StepStatus.REUSED,
        StepStatus.CACHED,
        StepStatus.REJECTED,
    }
)
PARKED_AS: Mapping[ParkReason, StepStatus] = MappingProxyType(
    {
        ParkReason.APPROVAL: StepStatus.AWAITING_APPROVAL,
        ParkReason.SIGNAL: StepStatus.AWAITING_SIGNAL,
        ParkReason.SLOT: StepStatus.AWAITING_SLOT,
        ParkReason.TIMER: StepStatus.SLEEPING,
        ParkReason.CHILD: StepStatus.AWAITING_CHILD,
    }
)
"""The status each reason parks a step in: a new reason is a new status and a row here."""
STEP_PARKED = frozenset({*PARKED_AS.values(), StepStatus.AWAITING_RATE})
"""Open, with no lease and no message: a decision, a signal or the beat leader moves it on.
A step parks for its rate limit outside ``parking``, once it is about to run
(``service.engine.rates``): a step that finds room then has cost no statement more."""
JOB_OPEN = frozenset({JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.AWAITING_APPROVAL})
APPROVAL_WAITING = frozenset({ApprovalStatus.PENDING, ApprovalStatus.ESCALATED})
COMPENSATION_FINAL = frozenset({CompensationStatus.COMPENSATED, CompensationStatus.FAILED})
STEP_SUCCESSFUL = frozenset({StepStatus.SUCCEEDED, StepStatus.REUSED, StepStatus.CACHED})
"""What a downstream step and the job's result take as done: run here, reused from the
checkpoint of the job this one reruns, or taken from the step cache."""
JOB_OPEN_SQL = sql_in((JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.AWAITING_APPROVAL))
STEP_SUCCESSFUL_SQL = sql_in((StepStatus.SUCCEEDED, StepStatus.REUSED, StepStatus.CACHED))
STEP_DUE_SQL = sql_in((StepStatus.PENDING, StepStatus.RETRYING))
"""A row whose next attempt a message may take now."""
JOB_INITIAL = frozenset({JobStatus.QUEUED})
STEP_INITIAL = frozenset({StepStatus.PENDING, StepStatus.REUSED})
"""A rerun stores the steps it takes from its parent as ``reused`` from the start."""


@dataclass(frozen=True)
class Transition:
    before: str
    after: str
    by: str
    """The ``module.function`` that carries it out."""
    when: str
    reopens: bool = False
    """A settled row starts over: a loop's next round, once the round that ended is archived
    in ``step_rounds``. The only way out of a final status."""


_P, _RUN, _RETRY = StepStatus.PENDING, StepStatus.RUNNING, StepStatus.RETRYING
_WAIT, _REJECT = StepStatus.AWAITING_APPROVAL, StepStatus.REJECTED
_SLOT = StepStatus.AWAITING_SLOT
_RATE = StepStatus.AWAITING_RATE
_SLEEP = StepStatus.SLEEPING
_SIGNAL = StepStatus.AWAITING_SIGNAL
_CHILD = StepStatus.AWAITING_CHILD
_OK, _FAIL, _SKIP, _CANCEL = (
    StepStatus.SUCCEEDED,
    StepStatus.FAILED,
    StepStatus.SKIPPED,
    StepStatus.CANCELLED,
)

STEP_TRANSITIONS: tuple[Transition, ...] = (
    Transition(
        _P, _RUN, "service.engine.claims.fast_claim", "its upstream allows it; a lease is taken"
    ),
    Transition(
        _P, _RUN, "service.engine.claims.claim_step", "its needs rule lets a failed upstream by"
    ),
    Transition(_P, _RUN, "service.engine.claims.fast_shard_claims", "a lane takes shards"),
    Transition(
        _P, _RUN, "service.engine.checkpoints.complete_step", "its only upstream's checkpoint: next"
    ),
    Transition(_RETRY, _RUN, "service.engine.claims.fast_claim", "the next attempt is delivered"),
    Transition(_RUN, _RUN, "service.engine.claims.fast_claim", "its lease lapsed: another worker"),
    Transition(_RUN, _OK, "service.engine.checkpoints.complete_step", "the checkpoint is written"),
    Transition(_RUN, _OK, "service.engine.loops.close_round", "a loop ends or goes round"),
    Transition(
        _RUN,
        StepStatus.CACHED,
        "service.engine.checkpoints.complete_step",
        "an entry of the step cache with its key, of its owner, within its TTL, gave its output",
    ),
    Transition(
        _OK, _P, "service.engine.loops.next_round", "its loop goes round again", reopens=True
    ),
    Transition(
        _SKIP, _P, "service.engine.loops.next_round", "its loop goes round again", reopens=True
    ),
    Transition(_RUN, _OK, "service.engine.shards.finish_fanout", "every shard settled"),
    Transition(_RUN, _OK, "service.engine.shards.fan_out", "a for_each over no items"),
    Transition(
        _RUN, _RETRY, "service.engine.completion.fail_step", "a retryable failure, attempts left"
    ),
    Transition(_RUN, _FAIL, "service.engine.completion.fail_step", "a failure for good"),
    Transition(_RUN, _FAIL, "service.engine.sweeper.sweep", "it ran past its timeout"),
    Transition(
        _P, _SKIP, "service.engine.completion.skip_step", "its needs rule refuses its upstream"
    ),
    Transition(_RUN, _SKIP, "service.engine.completion.skip_step", "its when condition is false"),
    Transition(_RUN, _WAIT, "service.engine.parking.park", "its gate has no decision yet"),
    Transition(_WAIT, _P, "service.engine.approvals.decide", "approved: sent again, to run"),
    Transition(
        _RUN, _WAIT, "service.engine.gates.ask_decision", "a loop ran out of rounds: escalate"
    ),
    Transition(_WAIT, _OK, "service.engine.approvals.decide", "approved: the loop ends"),
    Transition(_WAIT, _REJECT, "service.engine.approvals.decide", "rejected, or timed out so"),
    Transition(_RUN, _SLEEP, "service.engine.parking.park", "a wait step: parked until wake_at"),
    Transition(_RUN, _OK, "service.engine.parking.park", "a wait step whose time has passed"),
    Transition(_SLEEP, _OK, "service.engine.waits.wake_due", "its wake_at passed: the beat leader"),
    Transition(_WAIT, _CANCEL, "service.engine.settle.close_open_steps", "its job ended first"),
    Transition(_SLEEP, _CANCEL, "service.engine.settle.close_open_steps", "its job ended first"),
    Transition(_P, _CANCEL, "service.engine.settle.close_open_steps", "its job ended first"),
    Transition(_RUN, _CANCEL, "service.engine.settle.close_open_steps", "its job ended first"),
    Transition(_RETRY, _CANCEL, "service.engine.settle.close_open_steps", "its job ended first"),
    Transition(_RUN, _SLOT, "service.engine.parking.park", "its key has no slot free"),
    Transition(_SLOT, _P, "service.engine.slots.let_in_steps", "a slot of its key freed"),
    Transition(_SLOT, _CANCEL, "service.engine.settle.close_open_steps", "its job ended first"),
    Transition(_RUN, _RATE, "service.engine.rates.park_for_rate", "its key's window is full"),
    Transition(_RATE, _P, "service.engine.rates.wake_due_rates", "its key's window has room"),
    Transition(_RATE, _CANCEL, "service.engine.settle.close_open_steps", "its job ended first"),
    Transition(_RUN, _SIGNAL, "service.engine.parking.park", "its signal has not arrived"),
    Transition(_SIGNAL, _P, "service.engine.signals.send_signal", "its signal arrived"),
    Transition(
        _SIGNAL, _P, "service.engine.signals.resume_signalled", "it parked as its signal arrived"
    ),
    Transition(
        _SIGNAL, _P, "service.engine.signals.expire_waits", "timed out: on_timeout continue"
    ),
    Transition(_SIGNAL, _FAIL, "service.engine.signals.expire_waits", "timed out: on_timeout fail"),
    Transition(_SIGNAL, _CANCEL, "service.engine.settle.close_open_steps", "its job ended first"),
    Transition(_RUN, _CHILD, "service.engine.parking.park", "a pipeline.run step: its child"),
    Transition(
        _CHILD, _OK, "service.engine.children.advance_children", "its child succeeded, or started"
    ),
    Transition(
        _CHILD, _RETRY, "service.engine.children.advance_children", "its child failed: try again"
    ),
    Transition(
        _CHILD, _FAIL, "service.engine.children.advance_children", "its child failed, or can't run"
    ),
    Transition(_CHILD, _CANCEL, "service.engine.settle.close_open_steps", "its job ended first"),
)

_Q, _JRUN, _JWAIT = JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.AWAITING_APPROVAL
JOB_TRANSITIONS: tuple[Transition, ...] = (
    Transition(_JRUN, _JWAIT, "service.engine.parking.park", "a step waits for a decision"),
    Transition(_JWAIT, _JRUN, "service.engine.approvals.decide", "no step waits any more"),
    Transition(_JWAIT, JobStatus.FAILED, "service.engine.approvals.decide", "rejected, fail_fast"),
    Transition(
        _JWAIT, JobStatus.CANCELLED, "service.engine.jobs.cancel_job", "a person cancelled it"
    ),
    Transition(_Q, _JRUN, "service.engine.claims.fast_claim", "its first step is claimed"),
    Transition(
        _JRUN, JobStatus.SUCCEEDED, "service.engine.settle.settle_job", "its steps settled well"
    ),
    Transition(
        _Q, JobStatus.SUCCEEDED, "service.engine.settle.settle_job", "settled before any ran"
    ),
    Transition(
        _JRUN,
        JobStatus.SUCCEEDED,
        "service.engine.checkpoints.complete_step",
        "its sole sink checkpointed",
    ),
    Transition(
        _JRUN, JobStatus.FAILED, "service.engine.settle.settle_job", "a step it needed failed"
    ),
    Transition(
        _JRUN, JobStatus.FAILED, "service.engine.completion.fail_step", "a step failed, fail_fast"
    ),
    Transition(_Q, JobStatus.CANCELLED, "service.engine.jobs.cancel_job", "a person cancelled it"),
    Transition(
        _JRUN, JobStatus.CANCELLED, "service.engine.jobs.cancel_job", "a person cancelled it"
    ),
    Transition(
        _Q, JobStatus.CANCELLED, "service.triggers.firing.cancel_overdue", "a run timed out"
    ),
    Transition(
        _JRUN, JobStatus.CANCELLED, "service.triggers.firing.cancel_overdue", "a run timed out"
    ),
    Transition(
        _Q, JobStatus.FAILED, "service.engine.deadlines.expire_deadlines", "its deadline passed"
    ),
    Transition(
        _JRUN, JobStatus.FAILED, "service.engine.deadlines.expire_deadlines", "its deadline passed"
    ),
    Transition(
        _JWAIT, JobStatus.FAILED, "service.engine.deadlines.expire_deadlines", "its deadline passed"
    ),
)

_CP, _CRUN = CompensationStatus.PENDING, CompensationStatus.RUNNING
COMPENSATION_INITIAL = frozenset({_CP})
COMPENSATION_TRANSITIONS: tuple[Transition, ...] = (
    Transition(
        _CP, _CRUN, "service.engine.compensations.claim_next", "first unfinished, no live lease"
    ),
    Transition(_CRUN, _CRUN, "service.engine.compensations.claim_next", "its lease lapsed"),
    Transition(_CRUN, _CP, "service.engine.compensations.record_outcome", "failed, attempts left"),
    Transition(
        _CRUN, _CP, "service.engine.leases.release_compensation", "cut short before its outcome"
    ),
    Transition(
        _CRUN, CompensationStatus.COMPENSATED, "service.engine.compensations.record_outcome", "done"
    ),
    Transition(
        _CRUN, CompensationStatus.FAILED, "service.engine.compensations.record_outcome", "for good"
    ),
    Transition(
        _CP,
        CompensationStatus.FAILED,
        "service.engine.compensations.claim_next",
        "inputs unresolved",
    ),
)
