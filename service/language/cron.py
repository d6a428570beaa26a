"""Schedule specs and the pure arithmetic of fire times: no clock, no database, no I/O.

Cron expressions are evaluated on local wall-clock time in the schedule's IANA zone and then
mapped to UTC. A wall time that does not exist (the hour skipped when clocks go forward) maps
with the offset in force before the change, so it still fires once, just after the change. A
wall time that occurs twice (the hour repeated when clocks go back) fires only at its first
occurrence. Intervals are anchored at the Unix epoch, so every replica computes the same
fire times without sharing state.
"""

import hashlib
import itertools
import math
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from pydantic import BaseModel, ConfigDict, Field, field_validator

from service.language.labels import label_templates
from service.language.specs import NAME_PATTERN
from service.platform.constants import MAX_JOB_TIMEOUT_S, MAX_PRIORITY
from service.platform.errors import (
    CronInvalid,
    IntervalInvalid,
    TimezoneUnknown,
)

Overlap = Literal["skip", "allow", "buffer_one", "cancel_previous"]
Catchup = Literal["none", "latest", "all"]

DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"^(?:\d+[smhdw])+$")
_DURATION_PART = re.compile(r"(\d+)([smhdw])")
MAX_CRON_STEPS = 100_000
MIN_GAP_HORIZON_FIRES = 1000
MIN_GAP_HORIZON = timedelta(days=400)
MAX_CATCHUP_FIRES = 1000
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class ScheduleSpec(BaseModel):
    """The body of ``PUT .../schedule`` and the optional ``schedule:`` block of a profile.

    Only shapes are checked here; what needs the clock library or operator limits is checked
    by ``normalize`` and ``service.triggers.schedules`` so each problem gets its own error code.
    """

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(default=None, pattern=NAME_PATTERN, exclude_if=lambda n: n is None)
    """Tells a pipeline's schedules apart (``daily``, ``monthly``); unique per owner and
    pipeline. Routes and commands take a schedule by name or id, so a name never reads as
    a uuid."""
    cron: str | None = Field(default=None, max_length=200)
    every: str | int | None = None
    timezone: str = Field(default="UTC", max_length=64)
    params: dict[str, Any] = Field(default_factory=dict)
    enabled: bool = True
    overlap: Overlap = "skip"
    catchup: Catchup = "latest"
    catchup_window: str | int = "1h"
    jitter: str | int = 0
    diff_mode: bool = False
    notify_url: str | None = Field(default=None, max_length=2000, pattern=r"^https?://\S+$")
    timeout_s: int | None = Field(
        default=None,
        ge=1,
        le=MAX_JOB_TIMEOUT_S,
        exclude_if=lambda t: t is None,
        description="the deadline of the jobs it fires, in place of the profile's timeout_s",
    )
    """Left out of the stored form when unset, so the hash of a profile with a ``schedule:``
    block stays what it was."""
    priority: int | None = Field(
        default=None, ge=0, le=MAX_PRIORITY, exclude_if=lambda p: p is None
    )
    """The priority of the jobs it starts; ``None`` takes the profile's default."""
    labels: dict[str, str] = Field(
        default_factory=dict,
        exclude_if=lambda labels: not labels,
        description="labels of the jobs it starts, beside the profile's; a value may read params",
    )

    _labels_within_limits = field_validator("labels", mode="before")(label_templates)

    @field_validator("name")
    @classmethod
    def _name_is_not_an_id(cls, value: str | None) -> str | None:
        if value is not None and _is_uuid(value):
            raise ValueError("a schedule's name must not be a uuid: ids and names share a path")
        return value


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Timing:
    """When a schedule fires: exactly one of ``cron`` and ``every_s`` is set."""

    cron: str | None
    every_s: int | None
    timezone: str


@dataclass(frozen=True)
class NormalizedSchedule:
    name: str | None
    timing: Timing
    params: dict[str, Any]
    enabled: bool
    overlap: Overlap
    catchup: Catchup
    catchup_window_s: int
    jitter_s: int
    diff_mode: bool
    notify_url: str | None
    timeout_s: int | None
    priority: int | None
    labels: dict[str, str]


def parse_duration(value: str | int, *, field: str) -> int:
    """Seconds from ``"6h"``, ``"1h30m"``, ``"1d"`` or a plain number of seconds."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise IntervalInvalid(f"{field} must not be negative", {"field": field})
        return value
    text = str(value).strip().lower()
    if text.isdigit():
        return int(text)
    if not _DURATION.fullmatch(text):
        raise IntervalInvalid(
            f"{field}: {value!r} is not a duration like '30m', '6h' or '1d'",
            {"field": field, "value": value},
        )
    return sum(int(n) * DURATION_UNITS[unit] for n, unit in _DURATION_PART.findall(text))


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise TimezoneUnknown(f"unknown time zone {name!r}", {"timezone": name}) from exc


def parse_cron(expression: str) -> str:
    """A canonical five-field expression; seconds fields, macros and bad values are refused."""
    fields = expression.split()
    if len(fields) != 5 or not croniter.is_valid(" ".join(fields)):
        raise CronInvalid(
            f"{expression!r} is not a five-field cron expression "
            "(minute hour day-of-month month day-of-week)",
            {"cron": expression},
        )
    return " ".join(fields)


def normalize(spec: ScheduleSpec) -> NormalizedSchedule:
    if (spec.cron is None) == (spec.every is None):
        raise CronInvalid("give exactly one of 'cron' and 'every'", {})
    zone(spec.timezone)
    every_s = None
    if spec.every is not None:
        every_s = parse_duration(spec.every, field="every")
        if every_s <= 0:
            raise IntervalInvalid("every must be longer than 0s", {"field": "every"})
    cron = parse_cron(spec.cron) if spec.cron is not None else None
    return NormalizedSchedule(
        name=spec.name,
        timing=Timing(cron=cron, every_s=every_s, timezone=spec.timezone),
        params=dict(spec.params),
        enabled=spec.enabled,
        overlap=spec.overlap,
        catchup=spec.catchup,
        catchup_window_s=parse_duration(spec.catchup_window, field="catchup_window"),
        jitter_s=parse_duration(spec.jitter, field="jitter"),
        diff_mode=spec.diff_mode,
        notify_url=spec.notify_url,
        timeout_s=spec.timeout_s,
        priority=spec.priority,
        labels=spec.labels,
    )


def _wall_to_utc(wall: datetime, tz: ZoneInfo) -> datetime:
    return wall.replace(tzinfo=tz, fold=0).astimezone(UTC)


def _cron_fires(expression: str, tz: ZoneInfo, after: datetime) -> Iterator[datetime]:
    """UTC fire times strictly after ``after``, strictly increasing (see the module doc)."""
    wall = after.astimezone(tz).replace(tzinfo=None)
    walker = croniter(expression, wall - timedelta(hours=3))
    last = after
    for _ in range(MAX_CRON_STEPS):
        candidate = _wall_to_utc(walker.get_next(datetime), tz)
        if candidate > last:
            last = candidate
            yield candidate


def next_fire(timing: Timing, after: datetime) -> datetime:
    """The first fire time strictly after ``after`` (aware), in UTC."""
    if timing.every_s is not None:
        elapsed = int((after - EPOCH).total_seconds()) // timing.every_s
        return EPOCH + timedelta(seconds=(elapsed + 1) * timing.every_s)
    assert timing.cron is not None
    return next(_cron_fires(timing.cron, zone(timing.timezone), after))


def previous_fire(timing: Timing, before: datetime) -> datetime:
    """The last fire time strictly before ``before`` (aware), in UTC: where the period that
    the fire at ``before`` covers begins."""
    if timing.every_s is not None:
        periods = math.ceil((before - EPOCH).total_seconds() / timing.every_s)
        return EPOCH + timedelta(seconds=(periods - 1) * timing.every_s)
    assert timing.cron is not None
    tz = zone(timing.timezone)
    wall = before.astimezone(tz).replace(tzinfo=None)
    walker = croniter(timing.cron, wall + timedelta(hours=3))
    for _ in range(MAX_CRON_STEPS):
        candidate = _wall_to_utc(walker.get_prev(datetime), tz)
        if candidate < before:
            return candidate
    raise CronInvalid(f"{timing.cron!r} fires nowhere near {before}", {"cron": timing.cron})


def fires_between(timing: Timing, after: datetime, until: datetime) -> list[datetime]:
    """Fire times in (after, until], oldest first, at most the newest ``MAX_CATCHUP_FIRES``."""
    fires: list[datetime] = []
    current = after
    while True:
        current = next_fire(timing, current)
        if current > until:
            return fires
        fires.append(current)
        if len(fires) > MAX_CATCHUP_FIRES:
            fires.pop(0)


def min_gap_s(timing: Timing, start: datetime) -> float:
    """The smallest gap between consecutive fires over the horizon, DST changes included."""
    if timing.every_s is not None:
        return float(timing.every_s)
    fires = [next_fire(timing, start)]
    while len(fires) < MIN_GAP_HORIZON_FIRES and fires[-1] - start < MIN_GAP_HORIZON:
        fires.append(next_fire(timing, fires[-1]))
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(fires)]
    return min(gaps) if gaps else float("inf")


def due_fires(
    fires: list[datetime], now: datetime, *, catchup: Catchup, window_s: int, grace_s: float
) -> list[datetime]:
    """Which of the passed fires to run now.

    A fire no older than ``grace_s`` is on time (a leader failover delays it, it does not make
    it missed). Older fires were missed while no scheduler ran: ``none`` drops them, ``latest``
    runs the newest of them and ``all`` runs each, both only within ``window_s``.
    """
    on_time = [f for f in fires if (now - f).total_seconds() <= grace_s]
    missed = [f for f in fires if grace_s < (now - f).total_seconds() <= max(window_s, grace_s)]
    if catchup == "none" or not missed:
        return on_time
    if catchup == "latest":
        return on_time if on_time else missed[-1:]
    return missed + on_time


def jitter_s(schedule_id: str, fire: datetime, max_jitter_s: int) -> float:
    """A delay in [0, max) that every replica computes alike for the same (schedule, fire)."""
    if max_jitter_s <= 0:
        return 0.0
    digest = hashlib.sha256(f"{schedule_id}|{fire.isoformat()}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 * max_jitter_s
