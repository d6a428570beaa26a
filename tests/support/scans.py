"""Whether a statement found its rows through an index: its sequential scans of the tables
that grow with the history, counted with those scans priced out (ADR 26)."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sqlalchemy import text
from sqlalchemy.orm import Session

_SCANS = text(
    "SELECT coalesce(sum(seq_scan), 0) FROM pg_stat_xact_user_tables WHERE relname = ANY(:tables)"
)


@contextmanager
def sequential_scans(session: Session, *tables: str) -> Iterator[Callable[[], int]]:
    """Within the session's transaction, a count of the scans of ``tables`` since entering.
    Cached plans are dropped first, so every statement is planned with scans priced out: one
    that still scans has no index to take instead."""
    session.execute(text("DISCARD PLANS"))
    session.execute(text("SET LOCAL enable_seqscan = off"))
    names = {"tables": list(tables)}
    before = session.execute(_SCANS, names).scalar_one()
    yield lambda: int(session.execute(_SCANS, names).scalar_one() - before)
