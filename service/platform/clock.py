"""The one clock: aware UTC datetimes everywhere inside flowbeat."""

from datetime import UTC, datetime


def utcnow() -> datetime:
    return datetime.now(UTC)
