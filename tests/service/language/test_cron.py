"""Fire-time arithmetic: cron in a zone across DST, intervals, limits, catch-up and jitter."""

from datetime import UTC, datetime, timedelta

import pytest

from service.language.cron import (
    ScheduleSpec,
    Timing,
    due_fires,
    fires_between,
    jitter_s,
    min_gap_s,
    next_fire,
    normalize,
    parse_cron,
    parse_duration,
    previous_fire,
)
from service.platform.errors import CronInvalid, IntervalInvalid, TimezoneUnknown


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("45s", 45),
        ("30m", 1800),
        ("6h", 21600),
        ("1d", 86400),
        ("1w", 604800),
        ("1h30m", 5400),
        ("3600", 3600),
        (7200, 7200),
    ],
)
def test_durations_read_as_seconds(text: str | int, seconds: int) -> None:
    assert parse_duration(text, field="every") == seconds


@pytest.mark.parametrize("text", ["6 hours", "h", "1.5h", "-1", "", "6x"])
def test_malformed_durations_are_refused(text: str) -> None:
    with pytest.raises(IntervalInvalid):
        parse_duration(text, field="every")


@pytest.mark.parametrize(
    "expression", ["* * * *", "* * * * * *", "61 * * * *", "@daily", "0 9 * * mon-fri nope", "x"]
)
def test_only_valid_five_field_cron_expressions_are_accepted(expression: str) -> None:
    with pytest.raises(CronInvalid):
        parse_cron(expression)


def test_a_valid_expression_is_kept_with_normalized_spacing() -> None:
    assert parse_cron(" 0  9 * * mon ") == "0 9 * * mon"


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        (ScheduleSpec(cron="0 9 * * *", timezone="Mars/Olympus"), TimezoneUnknown),
        (ScheduleSpec(), CronInvalid),
        (ScheduleSpec(cron="0 9 * * *", every="1h"), CronInvalid),
        (ScheduleSpec(every="0s"), IntervalInvalid),
        (ScheduleSpec(every="1h", jitter="soon"), IntervalInvalid),
    ],
)
def test_normalize_refuses_each_problem_with_its_own_error(
    spec: ScheduleSpec, error: type[Exception]
) -> None:
    with pytest.raises(error):
        normalize(spec)


BERLIN_DAILY = Timing("30 2 * * *", None, "Europe/Berlin")
BERLIN_HOURLY = Timing("0 * * * *", None, "Europe/Berlin")
NY_WEEKLY = Timing("0 9 * * 1", None, "America/New_York")


@pytest.mark.parametrize(
    ("timing", "after", "expected"),
    [
        # 02:30 does not exist on 29 March in Berlin: it fires once, just after the change.
        (BERLIN_DAILY, utc(2026, 3, 28, 12), utc(2026, 3, 29, 1, 30)),
        (BERLIN_DAILY, utc(2026, 3, 29, 1, 30), utc(2026, 3, 30, 0, 30)),
        # 02:30 happens twice on 25 October: only the first one fires.
        (BERLIN_DAILY, utc(2026, 10, 24, 12), utc(2026, 10, 25, 0, 30)),
        (BERLIN_DAILY, utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)),
        # Monday 09:00 in New York follows the local clock across its DST change.
        (NY_WEEKLY, utc(2026, 3, 1), utc(2026, 3, 2, 14)),
        (NY_WEEKLY, utc(2026, 3, 8), utc(2026, 3, 9, 13)),
        (Timing(None, 21600, "UTC"), utc(2026, 1, 1, 5, 59, 59), utc(2026, 1, 1, 6)),
        (Timing(None, 21600, "UTC"), utc(2026, 1, 1, 6), utc(2026, 1, 1, 12)),
    ],
)
def test_next_fire(timing: Timing, after: datetime, expected: datetime) -> None:
    assert next_fire(timing, after) == expected


def test_an_hourly_cron_fires_once_per_real_hour_through_both_dst_changes() -> None:
    spring = fires_between(BERLIN_HOURLY, utc(2026, 3, 28, 23), utc(2026, 3, 29, 3))
    autumn = fires_between(BERLIN_HOURLY, utc(2026, 10, 24, 22), utc(2026, 10, 25, 3))
    assert spring == [utc(2026, 3, 29, h) for h in range(4)]
    assert autumn == [
        utc(2026, 10, 24, 23),
        utc(2026, 10, 25, 0),
        utc(2026, 10, 25, 2),
        utc(2026, 10, 25, 3),
    ]
    assert len(set(spring)) == len(spring) and len(set(autumn)) == len(autumn)


@pytest.mark.parametrize(
    ("timing", "gap"),
    [
        (Timing("*/5 * * * *", None, "UTC"), 300),
        (Timing("0 9,10 * * *", None, "UTC"), 3600),
        (Timing("0 9 * * 1", None, "America/New_York"), 7 * 86400 - 3600),
        (Timing(None, 7200, "UTC"), 7200),
    ],
)
def test_min_gap_is_the_closest_pair_of_fires_over_the_horizon(timing: Timing, gap: int) -> None:
    assert min_gap_s(timing, utc(2026, 1, 1)) == gap


NOW = utc(2026, 1, 1, 12)
FIRES = [NOW - timedelta(hours=h) for h in (5, 3, 2)] + [NOW - timedelta(seconds=10)]


@pytest.mark.parametrize(
    ("catchup", "window_s", "expected"),
    [
        ("none", 86400, FIRES[3:]),
        ("latest", 86400, FIRES[3:]),
        ("all", 86400, FIRES),
        ("all", 4 * 3600, FIRES[1:]),
    ],
)
def test_due_fires_keep_on_time_fires_and_catch_up_by_policy(
    catchup: str, window_s: int, expected: list[datetime]
) -> None:
    assert due_fires(FIRES, NOW, catchup=catchup, window_s=window_s, grace_s=30) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("catchup", "expected"), [("none", []), ("latest", FIRES[2:3]), ("all", FIRES[:3])]
)
def test_missed_fires_alone_run_by_policy(catchup: str, expected: list[datetime]) -> None:
    assert due_fires(FIRES[:3], NOW, catchup=catchup, window_s=86400, grace_s=30) == expected  # type: ignore[arg-type]


def test_jitter_is_deterministic_per_fire_and_within_bounds() -> None:
    delays = [jitter_s("s1", NOW + timedelta(hours=h), 60) for h in range(50)]
    assert delays == [jitter_s("s1", NOW + timedelta(hours=h), 60) for h in range(50)]
    assert all(0 <= d < 60 for d in delays) and len(set(delays)) > 40
    assert jitter_s("s1", NOW, 0) == 0


@pytest.mark.parametrize(
    ("timing", "before", "previous"),
    [
        pytest.param(
            Timing("0 9 * * 1", None, "Europe/Berlin"),
            datetime(2026, 1, 12, 8, tzinfo=UTC),
            datetime(2026, 1, 5, 8, tzinfo=UTC),
            id="weekly-from-a-fire",
        ),
        pytest.param(
            Timing("0 9 * * 1", None, "Europe/Berlin"),
            datetime(2026, 1, 14, tzinfo=UTC),
            datetime(2026, 1, 12, 8, tzinfo=UTC),
            id="weekly-between-fires",
        ),
        pytest.param(
            Timing("0 9 * * *", None, "Europe/Berlin"),
            datetime(2026, 3, 30, 7, tzinfo=UTC),
            datetime(2026, 3, 29, 7, tzinfo=UTC),
            id="across-the-spring-change",
        ),
        pytest.param(
            Timing(None, 3600, "UTC"),
            datetime(2026, 1, 1, 12, tzinfo=UTC),
            datetime(2026, 1, 1, 11, tzinfo=UTC),
            id="interval-from-a-fire",
        ),
        pytest.param(
            Timing(None, 3600, "UTC"),
            datetime(2026, 1, 1, 12, 30, tzinfo=UTC),
            datetime(2026, 1, 1, 12, tzinfo=UTC),
            id="interval-between-fires",
        ),
    ],
)
def test_the_previous_fire_is_the_last_one_strictly_before(
    timing: Timing, before: datetime, previous: datetime
) -> None:
    assert previous_fire(timing, before) == previous
    assert next_fire(timing, previous) >= before
