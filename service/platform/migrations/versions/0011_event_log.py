"""event log: every state change of a job, its steps, approvals and compensations, numbered per job

Revision ID: 0011
Revises: 0010

The events are written by triggers on the rows whose status changes, so no code path that
changes a status can forget its event, and the event commits or rolls back with the change.
The triggers are deferred to commit time: the per-job counter is locked only then, as the last
lock a transaction takes, so it orders a job's events in commit order (a reader that resumes
after sequence n can never miss a later-committed n - 1) without adding a lock-order cycle to
the engine, whose transactions lock step rows and job rows in either order. ``pg_notify``
carries only the job id, so the notices of one transaction fold into one.

Neither log table has a foreign key to ``jobs``: checking one locks the job row FOR KEY SHARE,
which waits for a transaction holding it FOR UPDATE (a step failure settling its job), while
that transaction's own commit waits for the counter the first one holds. A statement trigger
on ``jobs`` deletes the log of deleted jobs instead.
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_FUNCTIONS = """
CREATE FUNCTION flowbeat_append_event(job uuid, kind text, step text, body jsonb)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    next_seq integer;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM jobs WHERE id = job) THEN
        RETURN;
    END IF;
    INSERT INTO job_event_seqs AS c (job_id, seq) VALUES (job, 1)
    ON CONFLICT (job_id) DO UPDATE SET seq = c.seq + 1
    RETURNING seq INTO next_seq;
    INSERT INTO job_events (job_id, seq, kind, step_id, data, created_at)
    VALUES (job, next_seq, kind, step, body, clock_timestamp());
    PERFORM pg_notify('flowbeat_events', job::text);
END $$;

CREATE FUNCTION flowbeat_job_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    body jsonb := jsonb_build_object('status', NEW.status, 'trigger', NEW.trigger);
BEGIN
    IF NEW.error IS NOT NULL THEN
        body := body || jsonb_build_object('error', NEW.error);
    END IF;
    PERFORM flowbeat_append_event(NEW.id, 'job.' || NEW.status, NULL, body);
    RETURN NULL;
END $$;

CREATE FUNCTION flowbeat_step_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    body jsonb;
BEGIN
    IF NEW.shard >= 0 THEN
        SELECT jsonb_build_object(
                   'done', count(*) FILTER (WHERE status IN ('succeeded', 'reused', 'skipped')),
                   'failed', count(*) FILTER (WHERE status = 'failed'),
                   'total', count(*))
          INTO body
          FROM step_runs
         WHERE job_id = NEW.job_id AND step_id = NEW.step_id AND shard >= 0;
        PERFORM flowbeat_append_event(NEW.job_id, 'step.progress', NEW.step_id, body);
        RETURN NULL;
    END IF;
    body := jsonb_build_object('attempt', NEW.attempts, 'round', NEW.round);
    IF NEW.error IS NOT NULL AND NEW.status IN ('retrying', 'failed', 'rejected') THEN
        body := body || jsonb_build_object('error', NEW.error);
    END IF;
    PERFORM flowbeat_append_event(NEW.job_id, 'step.' || NEW.status, NEW.step_id, body);
    RETURN NULL;
END $$;

CREATE FUNCTION flowbeat_approval_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM flowbeat_append_event(
        NEW.job_id, 'approval.' || NEW.status, NEW.step_id,
        jsonb_strip_nulls(jsonb_build_object(
            'due_at', NEW.due_at, 'on_timeout', NEW.on_timeout,
            'decided_by', NEW.decided_by, 'comment', NEW.comment)));
    RETURN NULL;
END $$;

CREATE FUNCTION flowbeat_compensation_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    body jsonb := jsonb_build_object('attempt', NEW.attempts);
BEGIN
    IF NEW.error IS NOT NULL AND NEW.status <> 'compensated' THEN
        body := body || jsonb_build_object('error', NEW.error);
    END IF;
    PERFORM flowbeat_append_event(NEW.job_id, 'compensation.' || NEW.status, NEW.step_id, body);
    RETURN NULL;
END $$;

CREATE FUNCTION flowbeat_forget_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM job_events WHERE job_id IN (SELECT id FROM gone);
    DELETE FROM job_event_seqs WHERE job_id IN (SELECT id FROM gone);
    RETURN NULL;
END $$;

CREATE FUNCTION flowbeat_number_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    next_seq integer;
BEGIN
    INSERT INTO job_event_seqs AS c (job_id, seq) VALUES (NEW.job_id, 1)
    ON CONFLICT (job_id) DO UPDATE SET seq = c.seq + 1
    RETURNING seq INTO next_seq;
    UPDATE job_events SET seq = next_seq, created_at = clock_timestamp() WHERE id = NEW.id;
    PERFORM pg_notify('flowbeat_events', NEW.job_id::text);
    RETURN NULL;
END $$;
"""

_DEFERRED = "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW"
_TRIGGERS = f"""
CREATE CONSTRAINT TRIGGER jobs_created_event AFTER INSERT ON jobs {_DEFERRED}
    EXECUTE FUNCTION flowbeat_job_event();
CREATE CONSTRAINT TRIGGER jobs_status_event AFTER UPDATE OF status ON jobs {_DEFERRED}
    WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION flowbeat_job_event();
CREATE CONSTRAINT TRIGGER step_runs_status_event AFTER UPDATE OF status, attempts ON step_runs
    {_DEFERRED}
    WHEN (NEW.shard < 0 AND (OLD.status IS DISTINCT FROM NEW.status
                             OR OLD.attempts IS DISTINCT FROM NEW.attempts))
    EXECUTE FUNCTION flowbeat_step_event();
CREATE CONSTRAINT TRIGGER step_runs_created_event AFTER INSERT ON step_runs {_DEFERRED}
    WHEN (NEW.shard < 0 AND NEW.status <> 'pending')
    EXECUTE FUNCTION flowbeat_step_event();
CREATE CONSTRAINT TRIGGER step_runs_progress_event AFTER UPDATE OF status ON step_runs
    {_DEFERRED}
    WHEN (NEW.shard >= 0 AND OLD.status IS DISTINCT FROM NEW.status
          AND NEW.status IN ('succeeded', 'failed', 'skipped')
          AND (NEW.shard + 1) % power(10, greatest(1, floor(log(NEW.shard + 1))))::integer = 0)
    EXECUTE FUNCTION flowbeat_step_event();
CREATE CONSTRAINT TRIGGER approvals_created_event AFTER INSERT ON approvals {_DEFERRED}
    EXECUTE FUNCTION flowbeat_approval_event();
CREATE CONSTRAINT TRIGGER approvals_status_event AFTER UPDATE OF status ON approvals
    {_DEFERRED}
    WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION flowbeat_approval_event();
CREATE CONSTRAINT TRIGGER compensations_status_event AFTER UPDATE OF status ON compensations
    {_DEFERRED}
    WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION flowbeat_compensation_event();
CREATE TRIGGER jobs_forget_events AFTER DELETE ON jobs REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION flowbeat_forget_jobs();
CREATE CONSTRAINT TRIGGER job_events_numbered AFTER INSERT ON job_events {_DEFERRED}
    WHEN (NEW.seq IS NULL)
    EXECUTE FUNCTION flowbeat_number_event();
"""

_DROP = """
DROP TRIGGER job_events_numbered ON job_events;
DROP TRIGGER compensations_status_event ON compensations;
DROP TRIGGER approvals_status_event ON approvals;
DROP TRIGGER approvals_created_event ON approvals;
DROP TRIGGER step_runs_progress_event ON step_runs;
DROP TRIGGER step_runs_status_event ON step_runs;
DROP TRIGGER step_runs_created_event ON step_runs;
DROP TRIGGER jobs_status_event ON jobs;
DROP TRIGGER jobs_created_event ON jobs;
DROP TRIGGER jobs_forget_events ON jobs;
DROP FUNCTION flowbeat_forget_jobs();
DROP FUNCTION flowbeat_number_event();
DROP FUNCTION flowbeat_compensation_event();
DROP FUNCTION flowbeat_approval_event();
DROP FUNCTION flowbeat_step_event();
DROP FUNCTION flowbeat_job_event();
DROP FUNCTION flowbeat_append_event(uuid, text, text, jsonb);
"""


def upgrade() -> None:
    op.create_table(
        "job_event_seqs",
        sa.Column("job_id", sa.UUID(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_job_event_seqs")),
    )
    op.drop_constraint(op.f("fk_job_events_job_id_jobs"), "job_events", type_="foreignkey")
    op.add_column("job_events", sa.Column("seq", sa.Integer(), nullable=True))
    op.add_column("job_events", sa.Column("step_id", sa.String(length=64), nullable=True))
    op.execute(
        """
        UPDATE job_events AS e SET seq = n.seq
          FROM (SELECT id, row_number() OVER (PARTITION BY job_id ORDER BY id) AS seq
                  FROM job_events) AS n
         WHERE e.id = n.id
        """
    )
    op.execute(
        """
        INSERT INTO job_event_seqs (job_id, seq)
        SELECT job_id, max(seq) FROM job_events GROUP BY job_id
        """
    )
    op.drop_index(op.f("ix_job_events_job_id_id"), table_name="job_events")
    op.create_unique_constraint(op.f("uq_job_events_job_id_seq"), "job_events", ["job_id", "seq"])
    op.create_index(op.f("ix_job_events_created_at"), "job_events", ["created_at"])
    op.execute(_FUNCTIONS)
    op.execute(_TRIGGERS)


def downgrade() -> None:
    op.execute(_DROP)
    op.drop_index(op.f("ix_job_events_created_at"), table_name="job_events")
    op.drop_constraint(op.f("uq_job_events_job_id_seq"), "job_events", type_="unique")
    op.create_index(op.f("ix_job_events_job_id_id"), "job_events", ["job_id", "id"])
    op.drop_column("job_events", "step_id")
    op.drop_column("job_events", "seq")
    op.drop_table("job_event_seqs")
    op.execute("DELETE FROM job_events WHERE job_id NOT IN (SELECT id FROM jobs)")
    op.create_foreign_key(
        op.f("fk_job_events_job_id_jobs"),
        "job_events",
        "jobs",
        ["job_id"],
        ["id"],
        ondelete="CASCADE",
    )
