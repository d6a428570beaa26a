"""How long a literature request waits before its next attempt."""

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from service.actions.scholarly import retry_after_s
from service.platform.constants import LITERATURE_RETRY_AFTER_MAX_S

CAP = LITERATURE_RETRY_AFTER_MAX_S


@pytest.mark.parametrize(
    ("header", "expected"),
    [(None, 0.5), ("2", 2), ("0", 0), ("3600", CAP), ("soon", 0.5)],
)
def test_delta_seconds_are_honoured_within_a_cap(header: str | None, expected: float) -> None:
    assert retry_after_s(header, 0.5) == expected


@pytest.mark.parametrize(("offset_s", "low", "high"), [(10, 8, 10), (-10, 0, 0), (7200, CAP, CAP)])
def test_an_http_date_is_honoured_within_a_cap(offset_s: int, low: float, high: float) -> None:
    header = format_datetime(datetime.now(UTC) + timedelta(seconds=offset_s), usegmt=True)
    assert low <= retry_after_s(header, 0.5) <= high
