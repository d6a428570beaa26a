"""each event the log's triggers append is one statement, not five

The triggers of migration 0011 stay as they are (deferred to commit, one per changed row,
numbering each job's events in commit order); what each runs shrinks. Before, a trigger built
the event's body and called ``flowbeat_append_event``, which checked that the job still
existed, upserted the job's counter, inserted the event and notified: five statements an event
(the call, the check, two writes, the notification), fifteen a step of a chain. Now the
trigger's function runs one statement that does all four: the counter is bumped in place (or,
for a job's first event, inserted if the job exists), the event is inserted with the number
that returns, and the notification is sent for the row inserted.

Statement-level triggers over transition tables, which Hatchet's v1 engine uses, were measured
and set aside: flowbeat's statements change one or two rows each, and a statement trigger's
fixed cost (its transition tables, a plan of a dozen nodes, a staging row, a numbering
statement at commit) came to more CPU a step than the row triggers it replaced (ADR 8).

Revision ID: 0041
Revises: 0036
"""

import importlib.util
from pathlib import Path

from alembic import op

revision = "0041"
down_revision = "0039"
branch_labels = None
depends_on = None


def _append(job: str, kind: str, step: str, body: str) -> str:
    """The one statement that appends an event: nothing when the job is gone (deleted in the
    same transaction, which deletes its counter too), and the job's listeners notified once
    the transaction commits. The counter is updated in place when it exists, as it does from
    a job's first event on: an upsert would lock its row first, a WAL record of its own."""
    return f"""
    WITH bumped AS (
        UPDATE job_event_seqs SET seq = seq + 1 WHERE job_id = {job} RETURNING seq
    ), started AS (
        INSERT INTO job_event_seqs AS c (job_id, seq)
        SELECT {job}, 1
         WHERE NOT EXISTS (SELECT 1 FROM bumped)
           AND EXISTS (SELECT 1 FROM jobs WHERE id = {job})
        ON CONFLICT (job_id) DO UPDATE SET seq = c.seq + 1
        RETURNING seq
    ), counter AS (
        SELECT seq FROM bumped UNION ALL SELECT seq FROM started
    ), logged AS (
        INSERT INTO job_events (job_id, seq, kind, step_id, data, created_at)
        SELECT {job}, seq, {kind}, {step}, {body}, clock_timestamp() FROM counter
        RETURNING job_id
    )
    SELECT count(*) INTO appended
      FROM logged CROSS JOIN LATERAL pg_notify('flowbeat_events', logged.job_id::text);"""


_FUNCTIONS = f"""
CREATE OR REPLACE FUNCTION flowbeat_job_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    body jsonb := jsonb_build_object('status', NEW.status, 'trigger', NEW.trigger);
    appended integer;
BEGIN
    IF NEW.error IS NOT NULL THEN
        body := body || jsonb_build_object('error', NEW.error);
    END IF;
    {_append("NEW.id", "'job.' || NEW.status", "NULL::text", "body")}
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION flowbeat_step_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    body jsonb;
    kind text := 'step.' || NEW.status;
    appended integer;
BEGIN
    IF NEW.shard >= 0 THEN
        SELECT jsonb_build_object(
                   'done', count(*) FILTER (WHERE status IN ('succeeded', 'reused', 'skipped')),
                   'failed', count(*) FILTER (WHERE status = 'failed'),
                   'total', count(*))
          INTO body
          FROM step_runs
         WHERE job_id = NEW.job_id AND step_id = NEW.step_id AND shard >= 0;
        kind := 'step.progress';
    ELSE
        body := jsonb_build_object('attempt', NEW.attempts, 'round', NEW.round);
        IF NEW.error IS NOT NULL AND NEW.status IN ('retrying', 'failed', 'rejected') THEN
            body := body || jsonb_build_object('error', NEW.error);
        END IF;
    END IF;
    {_append("NEW.job_id", "kind", "NEW.step_id", "body")}
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION flowbeat_approval_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    body jsonb := jsonb_strip_nulls(jsonb_build_object(
        'due_at', NEW.due_at, 'on_timeout', NEW.on_timeout,
        'decided_by', NEW.decided_by, 'comment', NEW.comment));
    appended integer;
BEGIN
    {_append("NEW.job_id", "'approval.' || NEW.status", "NEW.step_id", "body")}
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION flowbeat_compensation_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    body jsonb := jsonb_build_object('attempt', NEW.attempts);
    appended integer;
BEGIN
    IF NEW.error IS NOT NULL AND NEW.status <> 'compensated' THEN
        body := body || jsonb_build_object('error', NEW.error);
    END IF;
    {_append("NEW.job_id", "'compensation.' || NEW.status", "NEW.step_id", "body")}
    RETURN NULL;
END $$;

DROP FUNCTION flowbeat_append_event(uuid, text, text, jsonb);
"""


def upgrade() -> None:
    op.execute(_FUNCTIONS)


def downgrade() -> None:
    """Back to 0011's functions, each event appended by ``flowbeat_append_event``."""
    path = Path(__file__).with_name("0011_event_log.py")
    spec = importlib.util.spec_from_file_location("flowbeat_revision_0011", path)
    assert spec is not None and spec.loader is not None
    event_log = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(event_log)
    op.execute(event_log._FUNCTIONS.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION"))
