"""The lifecycle table, written into PostgreSQL as the body of the function that every status
column's triggers ask (migrations 0020 and 0054), so that no statement can write a status the
table does not allow, whoever wrote the statement.

The body is rewritten from ``service.platform.states`` at every migration to head; the
table stays the one source. Allowed moves are a constant array in the function, so a check
costs an array lookup, not a query, on the claim and checkpoint path. An update's trigger asks
it in its ``WHEN`` condition and calls ``flowbeat_check_status`` only for a move it refuses, so
an allowed move queues no trigger event (ADR 23). A write refused is an error with SQLSTATE
``23514`` (check_violation) naming the move."""

from sqlalchemy import Connection, text

from service.platform.constants import LIFECYCLE_LOCK_ID
from service.platform.states import (
    COMPENSATION_INITIAL,
    COMPENSATION_TRANSITIONS,
    JOB_INITIAL,
    JOB_TRANSITIONS,
    STEP_INITIAL,
    STEP_TRANSITIONS,
    Transition,
)

FUNCTION = "flowbeat_move_allowed"
_TABLES: dict[str, tuple[frozenset[str], tuple[Transition, ...]]] = {
    "job": (frozenset(JOB_INITIAL), JOB_TRANSITIONS),
    "step": (frozenset(STEP_INITIAL), STEP_TRANSITIONS),
    "compensation": (frozenset(COMPENSATION_INITIAL), COMPENSATION_TRANSITIONS),
}


def allowed_moves() -> list[str]:
    """``entity:before>after`` for each transition, ``entity:>status`` for each first status."""
    moves = set()
    for entity, (initial, table) in _TABLES.items():
        moves |= {f"{entity}:>{status}" for status in initial}
        moves |= {f"{entity}:{t.before}>{t.after}" for t in table}
    return sorted(moves)


def function_body() -> str:
    array = "{" + ",".join(allowed_moves()) + "}"
    return f"""
BEGIN
    RETURN entity || ':' || coalesce(old_status, '') || '>' || new_status = ANY ('{array}'::text[]);
END
"""


def sync(connection: Connection) -> bool:
    """Write the table into the function the triggers ask, unless it is there already; returns
    whether it was rewritten. Processes starting together take turns, and each finds the last
    one's body before writing its own."""
    body = function_body()
    current = text("SELECT prosrc FROM pg_proc WHERE proname = :name")
    if connection.scalar(current, {"name": FUNCTION}) == body:
        return False
    connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": LIFECYCLE_LOCK_ID})
    if connection.scalar(current, {"name": FUNCTION}) == body:
        return False
    connection.exec_driver_sql(
        f"CREATE OR REPLACE FUNCTION {FUNCTION}(entity text, old_status text, new_status text) "
        f"RETURNS boolean LANGUAGE plpgsql STABLE AS $lifecycle${body}$lifecycle$"
    )
    return True
