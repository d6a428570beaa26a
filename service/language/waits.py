"""What a ``wait`` step waits for: ``seconds`` after it began, or ``until`` a time.

The same rules hold when a profile is saved (a value written out, ``problems``) and when the
step is claimed (a value a reference resolved to, ``wake_time``), so a literal that would fail
at run time is refused at save, where the file, step and field can be named.
"""

import math
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta
from typing import Any

from service.language.expressions import parse_refs
from service.language.specs import StepSpec
from service.platform.constants import WAIT_MAX_S
from service.platform.errors import WaitInvalid

WAIT_INPUTS = ("seconds", "until")


def wake_time(inputs: Mapping[str, Any], began: datetime) -> datetime:
    """When a wait step with these resolved inputs wakes; raises ``WaitInvalid``."""
    if "seconds" in inputs:
        return began + timedelta(seconds=wait_seconds(inputs["seconds"]))
    return wait_until(inputs.get("until"))


def wait_seconds(value: Any) -> float:
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if not is_number or not math.isfinite(value) or not 0 <= value <= WAIT_MAX_S:
        raise WaitInvalid(
            f"seconds must be a number from 0 to {WAIT_MAX_S} (90 days), got {value!r}",
            {"field": "seconds", "value": _shown(value)},
        )
    return float(value)


def wait_until(value: Any) -> datetime:
    """An ISO-8601 time with its zone: a wait on a local time would wake at a different moment
    on each host, so a time without one is refused rather than guessed."""
    moment = None
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            moment = None
    if moment is None or moment.tzinfo is None:
        raise WaitInvalid(
            f"until must be an ISO-8601 time with a zone, e.g. 2026-12-01T09:00:00Z, got {value!r}",
            {"field": "until", "value": _shown(value)},
        )
    return moment


def problems(step: StepSpec) -> Iterator[tuple[str, str]]:
    """(field, message) for each way a ``wait`` step is malformed, fields relative to the step."""
    given = set(step.with_)
    if len(given & set(WAIT_INPUTS)) != 1:
        yield "with", "a wait step takes exactly one of with.seconds and with.until"
    for name in sorted(given - set(WAIT_INPUTS)):
        yield f"with.{name}", f"a wait step takes only seconds or until, not {name!r}"
    for name, check in (("seconds", wait_seconds), ("until", wait_until)):
        value = step.with_.get(name)
        if name in given and not parse_refs(value):
            try:
                check(value)
            except WaitInvalid as exc:
                yield f"with.{name}", exc.message
    kept = {
        "for_each": step.for_each,
        "approval": step.approval,
        "compensate": step.compensate,
        "verify": step.verify or None,
        "concurrency": step.concurrency,
        "rate_limit": step.rate_limit,
    }
    for name, value in kept.items():
        if value is not None:
            yield name, f"a wait step cannot have {name}: it runs no action"


def _shown(value: Any) -> Any:
    return value if isinstance(value, str | int | float | bool) or value is None else repr(value)
