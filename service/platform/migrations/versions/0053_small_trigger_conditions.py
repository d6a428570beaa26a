"""each row trigger on a status change tests one small condition; the rest is in its function

PostgreSQL reads a row trigger's ``WHEN`` condition from its stored text and prepares it again
for every statement that fires the trigger (``TriggerEnabled`` in ``trigger.c``): a cost that
grows with the condition's size, paid even when its first test fails. The step path's
statements change one row or two each, so they paid it for every change of a step's or a
job's status: about 60 microseconds of a step row's update, the fan-out's progress condition
alone about 30 (ADR 23). Each trigger below now tests one column, which the step path's own
changes fail, and its function tests the rest, where plpgsql keeps the prepared expressions
for the session. ``step_runs_progress_event`` is folded into ``step_runs_status_event``: a
shard's change reaches the one function, which logs progress at the same shards as before.

Revision ID: 0053
Revises: 0052
"""

from alembic import op
from sqlalchemy import text

revision = "0053"
down_revision = "0052"
branch_labels = None
depends_on = None

_DEFERRED = "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW"
_UNMARKED = "OLD.logged_inline = NEW.logged_inline"
_OPEN = "('queued', 'running', 'awaiting_approval')"
_PROGRESS = """NEW.shard >= 0 AND OLD.status IS DISTINCT FROM NEW.status
          AND NEW.status IN ('succeeded', 'failed', 'skipped')
          AND (NEW.shard + 1) % power(10, greatest(1, floor(log(NEW.shard + 1))))::integer = 0"""

_STEP_GUARD = f"""    IF TG_OP = 'UPDATE' AND NOT (
        ({_PROGRESS})
        OR (NEW.shard < 0 AND {_UNMARKED}
            AND (OLD.status IS DISTINCT FROM NEW.status
                 OR OLD.attempts IS DISTINCT FROM NEW.attempts))) THEN
        RETURN NULL;
    END IF;
"""
_JOB_GUARD = """    IF TG_OP = 'UPDATE' AND OLD.status IS NOT DISTINCT FROM NEW.status THEN
        RETURN NULL;
    END IF;
"""
_GUARDS = {"flowbeat_step_event": _STEP_GUARD, "flowbeat_job_event": _JOB_GUARD}


def _notice(name: str, condition: str, channel: str) -> str:
    return f"""
CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF {condition} THEN
        PERFORM pg_notify('flowbeat_schedules', '{channel}');
    END IF;
    RETURN NULL;
END $$;"""


def _dependents(guard: str) -> str:
    return f"""
CREATE OR REPLACE FUNCTION flowbeat_queue_dependents() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN{guard}
    IF EXISTS (SELECT 1 FROM pipeline_triggers
                WHERE owner = NEW.owner AND upstream = NEW.pipeline) THEN
        INSERT INTO dependency_queue (upstream_job_id) VALUES (NEW.id) ON CONFLICT DO NOTHING;
        PERFORM pg_notify('flowbeat_schedules', 'dependency');
    END IF;
    RETURN NULL;
END $$;"""


_SUCCEEDED = """
    IF NEW.status <> 'succeeded' OR OLD.status IS NOT DISTINCT FROM NEW.status THEN
        RETURN NULL;
    END IF;"""
"""What ``jobs_queue_dependents`` tested besides the mark: a job that has just succeeded."""

_NOTICES = {
    "flowbeat_step_slot_freed": (
        "OLD.status = 'running' AND NEW.status <> 'running'",
        "concurrency",
    ),
    "flowbeat_job_slot_freed": (
        f"OLD.status IN {_OPEN} AND NEW.status NOT IN {_OPEN}",
        "concurrency",
    ),
    "flowbeat_parent_closed": ("NEW.status = 'cancelled'", "child"),
    "flowbeat_child_ended": (
        "OLD.status IS DISTINCT FROM NEW.status"
        " AND NEW.status IN ('succeeded', 'failed', 'cancelled')",
        "child",
    ),
}
"""The functions of the triggers that wake the beat, each with the conditions its trigger
tested before, and the channel's payload."""

_UP = f"""
{"".join(_notice(name, condition, payload) for name, (condition, payload) in _NOTICES.items())}
{_dependents(_SUCCEEDED)}
DROP TRIGGER step_runs_slot_freed ON step_runs;
CREATE TRIGGER step_runs_slot_freed AFTER UPDATE OF status ON step_runs
    FOR EACH ROW WHEN (OLD.slot_key IS NOT NULL)
    EXECUTE FUNCTION flowbeat_step_slot_freed();
DROP TRIGGER jobs_slot_freed ON jobs;
CREATE TRIGGER jobs_slot_freed AFTER UPDATE OF status ON jobs
    FOR EACH ROW WHEN (NEW.concurrency_key IS NOT NULL)
    EXECUTE FUNCTION flowbeat_job_slot_freed();
DROP TRIGGER step_runs_parent_closed ON step_runs;
CREATE TRIGGER step_runs_parent_closed AFTER UPDATE OF status ON step_runs
    FOR EACH ROW WHEN (OLD.status = 'awaiting_child')
    EXECUTE FUNCTION flowbeat_parent_closed();
DROP TRIGGER jobs_child_ended ON jobs;
CREATE TRIGGER jobs_child_ended AFTER UPDATE OF status ON jobs
    FOR EACH ROW WHEN (NEW.trigger = 'parent')
    EXECUTE FUNCTION flowbeat_child_ended();
DROP TRIGGER jobs_queue_dependents ON jobs;
CREATE TRIGGER jobs_queue_dependents AFTER UPDATE OF status ON jobs
    FOR EACH ROW WHEN ({_UNMARKED})
    EXECUTE FUNCTION flowbeat_queue_dependents();
DROP TRIGGER jobs_status_event ON jobs;
CREATE CONSTRAINT TRIGGER jobs_status_event AFTER UPDATE OF status ON jobs {_DEFERRED}
    WHEN ({_UNMARKED})
    EXECUTE FUNCTION flowbeat_job_event();
DROP TRIGGER step_runs_progress_event ON step_runs;
DROP TRIGGER step_runs_status_event ON step_runs;
CREATE CONSTRAINT TRIGGER step_runs_status_event AFTER UPDATE OF status, attempts ON step_runs
    {_DEFERRED}
    WHEN (NEW.shard >= 0 OR {_UNMARKED})
    EXECUTE FUNCTION flowbeat_step_event();
DROP FUNCTION flowbeat_child_call_moved();
"""

_DOWN = f"""
CREATE FUNCTION flowbeat_child_call_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('flowbeat_schedules', 'child');
    RETURN NULL;
END $$;
DROP TRIGGER step_runs_slot_freed ON step_runs;
CREATE TRIGGER step_runs_slot_freed AFTER UPDATE OF status ON step_runs
    FOR EACH ROW WHEN (OLD.slot_key IS NOT NULL AND OLD.status = 'running'
                       AND NEW.status <> 'running')
    EXECUTE FUNCTION flowbeat_slot_notice();
DROP TRIGGER jobs_slot_freed ON jobs;
CREATE TRIGGER jobs_slot_freed AFTER UPDATE OF status ON jobs
    FOR EACH ROW WHEN (NEW.concurrency_key IS NOT NULL
                       AND OLD.status IN {_OPEN} AND NEW.status NOT IN {_OPEN})
    EXECUTE FUNCTION flowbeat_slot_notice();
DROP TRIGGER step_runs_parent_closed ON step_runs;
CREATE TRIGGER step_runs_parent_closed AFTER UPDATE OF status ON step_runs FOR EACH ROW
    WHEN (OLD.status = 'awaiting_child' AND NEW.status = 'cancelled')
    EXECUTE FUNCTION flowbeat_child_call_moved();
DROP TRIGGER jobs_child_ended ON jobs;
CREATE TRIGGER jobs_child_ended AFTER UPDATE OF status ON jobs FOR EACH ROW
    WHEN (NEW.trigger = 'parent' AND OLD.status IS DISTINCT FROM NEW.status
          AND NEW.status IN ('succeeded', 'failed', 'cancelled'))
    EXECUTE FUNCTION flowbeat_child_call_moved();
DROP TRIGGER jobs_queue_dependents ON jobs;
CREATE TRIGGER jobs_queue_dependents AFTER UPDATE OF status ON jobs FOR EACH ROW
    WHEN (NEW.status = 'succeeded' AND OLD.status IS DISTINCT FROM NEW.status
          AND {_UNMARKED})
    EXECUTE FUNCTION flowbeat_queue_dependents();
DROP TRIGGER jobs_status_event ON jobs;
CREATE CONSTRAINT TRIGGER jobs_status_event AFTER UPDATE OF status ON jobs {_DEFERRED}
    WHEN (OLD.status IS DISTINCT FROM NEW.status AND {_UNMARKED})
    EXECUTE FUNCTION flowbeat_job_event();
DROP TRIGGER step_runs_status_event ON step_runs;
CREATE CONSTRAINT TRIGGER step_runs_status_event AFTER UPDATE OF status, attempts ON step_runs
    {_DEFERRED}
    WHEN (NEW.shard < 0 AND (OLD.status IS DISTINCT FROM NEW.status
                             OR OLD.attempts IS DISTINCT FROM NEW.attempts)
          AND {_UNMARKED})
    EXECUTE FUNCTION flowbeat_step_event();
CREATE CONSTRAINT TRIGGER step_runs_progress_event AFTER UPDATE OF status ON step_runs
    {_DEFERRED}
    WHEN ({_PROGRESS})
    EXECUTE FUNCTION flowbeat_step_event();
{"".join(f"DROP FUNCTION {name}();" for name in _NOTICES)}
{_dependents("")}
"""


def _guard(function: str, guarded: bool) -> None:
    """Put the conditions its triggers no longer test at the head of an event function's body,
    or take them out again; the rest of the body stays as the migrations before wrote it."""
    bind = op.get_bind()
    body = bind.scalar(text("SELECT prosrc FROM pg_proc WHERE proname = :f"), {"f": function})
    start, guard = "\nBEGIN\n", _GUARDS[function]
    assert body is not None and start in body
    body = body.replace(start, start + guard, 1) if guarded else body.replace(guard, "", 1)
    op.execute(
        f"CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql "
        f"AS $body${body}$body$"
    )


def upgrade() -> None:
    for function in _GUARDS:
        _guard(function, guarded=True)
    op.execute(_UP)


def downgrade() -> None:
    op.execute(_DOWN)
    for function in _GUARDS:
        _guard(function, guarded=False)
