"""How long a literature request waits before its next attempt."""

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from service.actions.scholarly import retry_after_s
from service.constants import LITERATURE_RETRY_AFTER_MAX_S


def in_seconds(seconds: float) -> str:
    return format_datetime(datetime.now(UTC) + timedelta(seconds=seconds), usegmt=True)


@pytest.mark.parametrize(
    ("header", "low", "high"),
    [
        (None, 0.5, 0.5),
        ("2", 2, 2),
        ("0", 0, 0),
        ("3600", LITERATURE_RETRY_AFTER_MAX_S, LITERATURE_RETRY_AFTER_MAX_S),
        ("soon", 0.5, 0.5),
        (in_seconds(10), 8, 10),
        (in_seconds(-10), 0, 0),
        (in_seconds(7200), LITERATURE_RETRY_AFTER_MAX_S, LITERATURE_RETRY_AFTER_MAX_S),
    ],
)
def test_retry_after_is_honoured_within_a_cap(header: str | None, low: float, high: float) -> None:
    assert low <= retry_after_s(header, 0.5) <= high
