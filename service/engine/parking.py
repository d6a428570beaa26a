"""Parking: whether a claimed step waits, holding no lease and no message, and for what.

A step parks for one ``ParkReason`` of the lifecycle table, each in its own status
(``PARKED_AS``): an approval gate with no decision yet, a signal not sent yet, no free slot of
its concurrency key, a ``wait`` step's timer, a ``pipeline.run`` step's child job. Which of
them a step can meet is read from its spec before any statement: a step that can meet none
costs none here, and a plain step, whose claim needs no transaction, never comes here at all.
The reasons it can meet are asked in one transaction, each through the one function of its own
module, and the first that parks the step decides.

The order is the one the engine has always kept. The gate and the signal come first: a person
is asked before the step's ``when`` settles anything, and the ``when`` may read the signal. The
``when`` comes next, since a step it skips takes no slot; then the slot. The timer and the
child come last, as their inputs say until when or which pipeline: they are resolved here, for
the reasons whose park needs them.
"""

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from service.engine.children import call_child
from service.engine.gates import approved
from service.engine.inputs import Held, resolve_held, unless_condition
from service.engine.leases import HeldRows, held_rows
from service.engine.signals import signalled
from service.engine.slots import take_step_slot
from service.engine.steps import Skipped, StepKey, Unresolvable, Woke
from service.engine.waits import sleep
from service.language.specs import StepSpec
from service.platform.constants import PIPELINE_RUN_ACTION, WAIT_ACTION
from service.platform.states import ParkReason


@dataclass(frozen=True)
class Parked:
    """Nothing of the step runs now: it waits for ``reason``, in ``PARKED_AS[reason]``, without
    its lease, until what it waits for sends it again."""

    key: StepKey
    reason: ParkReason


@dataclass(frozen=True)
class NotHeld:
    """The lease it was claimed under was no longer this worker's when its rows were locked
    (its job ended, or a peer took it once the lease lapsed): nothing of it runs here."""

    key: StepKey


@dataclass(frozen=True)
class Goes:
    """Nothing parks it: it goes on to resolve its inputs, or to fan out on ``rows``. The rows
    are locked here, once, for whatever writes on them in this transaction (a gate, a signal, a
    timer, a fan-out); ``None`` when nothing does."""

    rows: HeldRows | None


Parking = Parked | NotHeld | Goes | Skipped | Unresolvable | Woke
"""What ``park`` decided: parked, not this worker's, going on, or settled without running (its
``when`` skipped it or failed it for good, or its wait was over at once) with what that made
ready."""


def park(session: Session, held: Held, now: datetime) -> Parking:
    """Whether the held step parks, and why; asked once, before its inputs resolve."""
    key, spec = held.key, held.spec
    rows = None
    if _writes_rows(spec):
        rows = held_rows(session, key, held.lease)
        if rows is None:
            return NotHeld(key)
        job, row = rows
        if spec.approval is not None and not approved(session, job, row, spec.approval):
            return Parked(key, ParkReason.APPROVAL)
        if spec.wait_for is not None and not signalled(session, row, spec.wait_for, now):
            return Parked(key, ParkReason.SIGNAL)
    unless = unless_condition(session, held, now)
    if unless is not None:
        return unless
    if not take_step_slot(session, key, spec, held.params, now):
        return Parked(key, ParkReason.SLOT)
    if rows is not None and spec.action in (WAIT_ACTION, PIPELINE_RUN_ACTION):
        return _wait_on_inputs(session, held, rows, now)
    return Goes(rows)


def _writes_rows(spec: StepSpec) -> bool:
    """Read from the spec alone: a step none of whose reasons or fan-out writes on its rows
    takes no lock here (a slot is taken in one statement of its own)."""
    return (
        spec.approval is not None
        or spec.wait_for is not None
        or spec.action in (WAIT_ACTION, PIPELINE_RUN_ACTION)
        or spec.for_each is not None
    )


def _wait_on_inputs(session: Session, held: Held, rows: HeldRows, now: datetime) -> Parking:
    """A timer or a child job, which its inputs say until when or which pipeline."""
    claimed = resolve_held(session, held, now)
    if isinstance(claimed, Unresolvable):
        return claimed
    if held.spec.action == WAIT_ACTION:
        woke = sleep(session, *rows, claimed.inputs, now)
        return Parked(held.key, ParkReason.TIMER) if woke is None else woke
    failed = call_child(session, rows, held.lease.attempt, claimed.inputs, now)
    return Parked(held.key, ParkReason.CHILD) if failed is None else failed
