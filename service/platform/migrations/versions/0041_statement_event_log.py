"""the event log and the lifecycle check run once per statement, not once per changed row

Each status-changing table has one AFTER trigger per operation FOR EACH STATEMENT over its
transition tables. It runs one statement: it checks every status move of the statement
against the lifecycle table (``flowbeat_status_moves``, which ``service.platform.lifecycle``
writes at every migration to head) and refuses a move the table lacks with SQLSTATE 23514, and
it appends the statement's events, in the order its rows changed, to the transaction's batch:
one row of the unlogged ``job_event_batches``, keyed by the transaction. The events of a job
deleted by then are dropped, as before. That row's insertion,
the first of the transaction, queues one deferred trigger; at commit it numbers the whole batch
in one statement, locking the counters of its jobs in job order as the last locks the
transaction takes, so events are still numbered per job in commit order. The batch row is
deleted by the same statement, so it never outlives its transaction, and being unlogged it
writes no WAL.

Before, each changed row ran a deferred row trigger that appended its event alone (a check of
the job, an upsert of its counter, an insert, a notification), and a BEFORE row trigger
checked the move.

Revision ID: 0041
Revises: 0036
"""

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0041"
down_revision = "0036"
branch_labels = None
depends_on = None

SHARD_DONE = "('succeeded', 'failed', 'skipped')"
PROGRESS_MARK = "(n.shard + 1) % power(10, greatest(1, floor(log(n.shard + 1))))::integer = 0"
STEP_ERROR = "('retrying', 'failed', 'rejected')"
WITH_ERROR = "|| CASE WHEN {cond} THEN jsonb_build_object('error', n.error) ELSE '{{}}' END"
ORDERED_NEW = "(SELECT *, row_number() OVER () AS ord FROM new_rows) AS n"
"""A transition table is scanned in the order its rows changed: ``ord`` keeps that order."""

_CHANGES = {
    "jobs_inserted": f"""
        SELECT n.id AS job_id, n.ord, 'job:>' || n.status AS move, 'job.' || n.status AS kind,
               NULL::text AS step_id,
               jsonb_build_object('status', n.status, 'trigger', n.trigger)
               {WITH_ERROR.format(cond="n.error IS NOT NULL")} AS body
          FROM {ORDERED_NEW}""",
    "jobs_updated": f"""
        SELECT n.id AS job_id, n.ord, 'job:' || o.status || '>' || n.status AS move,
               'job.' || n.status AS kind, NULL::text AS step_id,
               jsonb_build_object('status', n.status, 'trigger', n.trigger)
               {WITH_ERROR.format(cond="n.error IS NOT NULL")} AS body
          FROM {ORDERED_NEW} JOIN old_rows AS o ON o.id = n.id
         WHERE n.status IS DISTINCT FROM o.status""",
    "step_runs_inserted": f"""
        SELECT n.job_id, n.ord, 'step:>' || n.status AS move,
               CASE WHEN n.shard < 0 AND n.status <> 'pending' THEN 'step.' || n.status END
                   AS kind,
               n.step_id,
               jsonb_build_object('attempt', n.attempts, 'round', n.round)
               {WITH_ERROR.format(cond=f"n.error IS NOT NULL AND n.status IN {STEP_ERROR}")}
                   AS body
          FROM {ORDERED_NEW}""",
    "step_runs_updated": f"""
        SELECT c.job_id, c.ord, c.move, c.kind, c.step_id,
               CASE WHEN c.kind = 'step.progress' THEN (
                   SELECT jsonb_build_object(
                              'done', count(*) FILTER (
                                  WHERE p.status IN ('succeeded', 'reused', 'skipped')),
                              'failed', count(*) FILTER (WHERE p.status = 'failed'),
                              'total', count(*))
                     FROM step_runs AS p
                    WHERE p.job_id = c.job_id AND p.step_id = c.step_id AND p.shard >= 0)
               ELSE c.body END AS body
          FROM (
            SELECT n.job_id, n.ord, n.step_id,
                   CASE WHEN n.status IS DISTINCT FROM o.status
                        THEN 'step:' || o.status || '>' || n.status END AS move,
                   CASE WHEN n.shard < 0 THEN 'step.' || n.status
                        WHEN n.status IS DISTINCT FROM o.status AND n.status IN {SHARD_DONE}
                             AND {PROGRESS_MARK} THEN 'step.progress' END AS kind,
                   jsonb_build_object('attempt', n.attempts, 'round', n.round)
                   {WITH_ERROR.format(cond=f"n.error IS NOT NULL AND n.status IN {STEP_ERROR}")}
                       AS body
              FROM {ORDERED_NEW} JOIN old_rows AS o ON o.id = n.id
             WHERE n.status IS DISTINCT FROM o.status OR n.attempts IS DISTINCT FROM o.attempts
          ) AS c""",
    "compensations_inserted": f"""
        SELECT n.job_id, n.ord, 'compensation:>' || n.status AS move, NULL::text AS kind,
               n.step_id, NULL::jsonb AS body
          FROM {ORDERED_NEW}""",
    "compensations_updated": f"""
        SELECT n.job_id, n.ord, 'compensation:' || o.status || '>' || n.status AS move,
               'compensation.' || n.status AS kind, n.step_id,
               jsonb_build_object('attempt', n.attempts)
               {WITH_ERROR.format(cond="n.error IS NOT NULL AND n.status <> 'compensated'")}
                   AS body
          FROM {ORDERED_NEW}
          JOIN old_rows AS o ON o.job_id = n.job_id AND o.step_id = n.step_id
         WHERE n.status IS DISTINCT FROM o.status""",
    "approvals_inserted": f"""
        SELECT n.job_id, n.ord, NULL::text AS move, 'approval.' || n.status AS kind, n.step_id,
               jsonb_strip_nulls(jsonb_build_object(
                   'due_at', n.due_at, 'on_timeout', n.on_timeout,
                   'decided_by', n.decided_by, 'comment', n.comment)) AS body
          FROM {ORDERED_NEW}""",
    "approvals_updated": f"""
        SELECT n.job_id, n.ord, NULL::text AS move, 'approval.' || n.status AS kind, n.step_id,
               jsonb_strip_nulls(jsonb_build_object(
                   'due_at', n.due_at, 'on_timeout', n.on_timeout,
                   'decided_by', n.decided_by, 'comment', n.comment)) AS body
          FROM {ORDERED_NEW}
          JOIN old_rows AS o ON o.job_id = n.job_id AND o.step_id = n.step_id
         WHERE n.status IS DISTINCT FROM o.status""",
}
"""What each statement changed: the lifecycle move to check (``move``, none for approvals,
which the lifecycle table does not cover) and the event to log (``kind``, none when the
change is not one the log records)."""


RANKS = {"jobs_inserted": 0, "jobs_updated": 2}
"""Where a table's events go among those of one statement, whose tables' triggers fire in no
set order: a job's creation before its steps', a job's change of status after its steps' (a
claim starts the step, then the job; a last checkpoint settles the step, then the job)."""


def _function(name: str, changes: str) -> str:
    """The trigger's one statement. The lifecycle check is an aggregate over every changed
    row, so it runs for each whether or not the row is logged; ``OR`` stops at an allowed
    move, and ``flowbeat_refuse_move`` raises on the first that is not. Each event carries
    its statement's start and its table's rank, by which commit orders a statement's events."""
    rank = RANKS.get(name, 1)
    return f"""
CREATE FUNCTION flowbeat_{name}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    WITH changed AS ({changes})
    INSERT INTO job_event_batches AS b (tx, events)
    SELECT pg_current_xact_id()::text::bigint,
           jsonb_agg(jsonb_build_array(
               job_id, kind, step_id, body, extract(epoch FROM statement_timestamp()), {rank})
               ORDER BY ord)
               FILTER (WHERE kind IS NOT NULL)
      FROM changed
    HAVING bool_and(move IS NULL OR move = ANY (flowbeat_status_moves())
                    OR flowbeat_refuse_move(move))
       AND count(*) FILTER (WHERE kind IS NOT NULL) > 0
    ON CONFLICT (tx) DO UPDATE SET events = b.events || excluded.events;
    RETURN NULL;
END $$;
"""


_COMMON = """
CREATE UNLOGGED TABLE job_event_batches (
    tx bigint CONSTRAINT pk_job_event_batches PRIMARY KEY,
    events jsonb NOT NULL
);

CREATE FUNCTION flowbeat_status_moves() RETURNS text[] LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $lifecycle$ SELECT NULL::text[] $lifecycle$;

CREATE FUNCTION flowbeat_refuse_move(move text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING
        MESSAGE = 'status move ' || move || ' is not in the lifecycle table',
        ERRCODE = 'check_violation';
END $$;

CREATE FUNCTION flowbeat_log_batch() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    notified integer;
BEGIN
    WITH batch AS (
        DELETE FROM job_event_batches WHERE tx = NEW.tx RETURNING events
    ), staged AS (
        SELECT (e.value->>0)::uuid AS job_id, e.value->>1 AS kind, e.value->>2 AS step_id,
               e.value->3 AS body, (e.value->>4)::numeric AS statement,
               (e.value->>5)::integer AS rank, e.ord
          FROM batch, jsonb_array_elements(batch.events) WITH ORDINALITY AS e(value, ord)
    ), counters AS (
        INSERT INTO job_event_seqs AS c (job_id, seq)
        SELECT s.job_id, s.events
          FROM (SELECT job_id, count(*) AS events FROM staged GROUP BY job_id) AS s
         CROSS JOIN LATERAL (SELECT 1 FROM jobs WHERE jobs.id = s.job_id LIMIT 1) AS live
         ORDER BY s.job_id
        ON CONFLICT (job_id) DO UPDATE SET seq = c.seq + excluded.seq
        RETURNING c.job_id, c.seq AS last
    ), logged AS (
        INSERT INTO job_events (job_id, seq, kind, step_id, data, created_at)
        SELECT s.job_id,
               n.last - count(*) OVER w + row_number() OVER (w ORDER BY s.statement, s.rank, s.ord),
               s.kind, s.step_id, s.body, clock_timestamp()
          FROM staged AS s JOIN counters AS n ON n.job_id = s.job_id
        WINDOW w AS (PARTITION BY s.job_id)
        RETURNING job_id
    )
    SELECT count(*) INTO notified
      FROM (SELECT DISTINCT job_id FROM logged) AS j
     CROSS JOIN LATERAL pg_notify('flowbeat_events', j.job_id::text);
    RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER job_event_batches_logged AFTER INSERT ON job_event_batches
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION flowbeat_log_batch();
"""

_OLD_TRIGGERS = {
    "jobs": ("jobs_created_event", "jobs_status_event", "jobs_lifecycle", "jobs_lifecycle_insert"),
    "step_runs": (
        "step_runs_status_event",
        "step_runs_created_event",
        "step_runs_progress_event",
        "step_runs_lifecycle",
        "step_runs_lifecycle_insert",
    ),
    "approvals": ("approvals_created_event", "approvals_status_event"),
    "compensations": (
        "compensations_status_event",
        "compensations_lifecycle",
        "compensations_lifecycle_insert",
    ),
}
_OLD_FUNCTIONS = (
    "flowbeat_check_status()",
    "flowbeat_compensation_event()",
    "flowbeat_approval_event()",
    "flowbeat_step_event()",
    "flowbeat_job_event()",
    "flowbeat_append_event(uuid, text, text, jsonb)",
)


def _triggers() -> str:
    statements = []
    for name in _CHANGES:
        table, operation = name.rsplit("_", 1)
        verb = "INSERT" if operation == "inserted" else "UPDATE"
        old = "" if verb == "INSERT" else "OLD TABLE AS old_rows "
        statements.append(
            f"CREATE TRIGGER {name} AFTER {verb} ON {table} "
            f"REFERENCING {old}NEW TABLE AS new_rows "
            f"FOR EACH STATEMENT EXECUTE FUNCTION flowbeat_{name}();"
        )
    return "\n".join(statements)


def upgrade() -> None:
    for table, triggers in _OLD_TRIGGERS.items():
        for trigger in triggers:
            op.execute(f"DROP TRIGGER {trigger} ON {table}")
    for function in _OLD_FUNCTIONS:
        op.execute(f"DROP FUNCTION {function}")
    op.execute(_COMMON)
    for name, changes in _CHANGES.items():
        op.execute(_function(name, changes))
    op.execute(_triggers())


def _revision(stem: str) -> ModuleType:
    """An earlier revision's module, whose SQL the downgrade puts back as it was."""
    path = Path(__file__).with_name(f"{stem}.py")
    spec = importlib.util.spec_from_file_location(f"flowbeat_revision_{stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def downgrade() -> None:
    for name in _CHANGES:
        table = name.rsplit("_", 1)[0]
        op.execute(f"DROP TRIGGER {name} ON {table}")
        op.execute(f"DROP FUNCTION flowbeat_{name}()")
    op.execute("DROP TABLE job_event_batches")
    op.execute("DROP FUNCTION flowbeat_log_batch()")
    op.execute("DROP FUNCTION flowbeat_refuse_move(text)")
    op.execute("DROP FUNCTION flowbeat_status_moves()")
    event_log = _revision("0011_event_log")
    functions = event_log._FUNCTIONS.split("CREATE FUNCTION flowbeat_forget_jobs()")[0]
    op.execute(functions)
    triggers = event_log._TRIGGERS.split("CREATE TRIGGER jobs_forget_events")[0]
    op.execute(triggers.split("CREATE CONSTRAINT TRIGGER job_events_numbered")[0])
    _revision("0020_lifecycle_trigger").upgrade()
