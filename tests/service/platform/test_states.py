"""The lifecycle tables: every status reachable, none without a way out, each row carried out."""

import importlib
from collections.abc import Iterable
from enum import StrEnum

import pytest

from service.platform.states import (
    COMPENSATION_FINAL,
    COMPENSATION_INITIAL,
    COMPENSATION_TRANSITIONS,
    JOB_FINAL,
    JOB_INITIAL,
    JOB_TRANSITIONS,
    PARKED_AS,
    STEP_FINAL,
    STEP_INITIAL,
    STEP_TRANSITIONS,
    CompensationStatus,
    JobStatus,
    ParkReason,
    StepStatus,
    Transition,
)

TABLES = [
    pytest.param(StepStatus, STEP_INITIAL, STEP_FINAL, STEP_TRANSITIONS, id="step"),
    pytest.param(JobStatus, JOB_INITIAL, JOB_FINAL, JOB_TRANSITIONS, id="job"),
    pytest.param(
        CompensationStatus,
        COMPENSATION_INITIAL,
        COMPENSATION_FINAL,
        COMPENSATION_TRANSITIONS,
        id="compensation",
    ),
]


def _reachable(start: Iterable[str], table: Iterable[Transition]) -> set[str]:
    seen, frontier = set(start), set(start)
    while frontier:
        frontier = {t.after for t in table if t.before in frontier} - seen
        seen |= frontier
    return seen


@pytest.mark.parametrize(("statuses", "initial", "final", "table"), TABLES)
def test_every_status_is_reachable_from_the_first(
    statuses: type[StrEnum],
    initial: frozenset[str],
    final: frozenset[str],
    table: tuple[Transition, ...],
) -> None:
    assert _reachable(initial, table) == set(statuses)


@pytest.mark.parametrize(("statuses", "initial", "final", "table"), TABLES)
def test_every_open_status_has_a_way_to_a_final_one(
    statuses: type[StrEnum],
    initial: frozenset[str],
    final: frozenset[str],
    table: tuple[Transition, ...],
) -> None:
    for status in set(statuses) - final:
        assert _reachable({status}, table) & final, status


@pytest.mark.parametrize(("statuses", "initial", "final", "table"), TABLES)
def test_a_final_status_is_left_only_for_a_loops_next_round(
    statuses: type[StrEnum],
    initial: frozenset[str],
    final: frozenset[str],
    table: tuple[Transition, ...],
) -> None:
    assert [t for t in table if t.before in final and not t.reopens] == []
    assert {t.by for t in table if t.reopens} <= {"service.engine.loops.next_round"}


@pytest.mark.parametrize(
    "transition",
    [*STEP_TRANSITIONS, *JOB_TRANSITIONS, *COMPENSATION_TRANSITIONS],
    ids=lambda t: f"{t.before}-{t.after}",
)
def test_each_transition_names_the_function_that_carries_it_out(transition: Transition) -> None:
    module, _, function = transition.by.rpartition(".")
    assert callable(getattr(importlib.import_module(module), function))


@pytest.mark.parametrize("reason", list(ParkReason))
def test_a_running_step_parks_only_through_the_parking_call(reason: ParkReason) -> None:
    """A loop out of rounds asks a person from its checkpoint, not from a claim."""
    parked = PARKED_AS[reason]
    into = {t.by for t in STEP_TRANSITIONS if t.before == StepStatus.RUNNING and t.after == parked}
    assert into - {"service.engine.gates.ask_decision"} == {"service.engine.parking.park"}
