"""a job's concurrency key and limit, what it waits for, and a wake-up when a slot may free

Revision ID: 0025
Revises: 0024
"""

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

OPEN = "('queued', 'running', 'awaiting_approval')"


def upgrade() -> None:
    op.add_column("jobs", sa.Column("concurrency_key", sa.Text(), nullable=True))
    op.add_column("jobs", sa.Column("concurrency_limit", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("waiting_for", sa.String(24), nullable=True))
    op.create_index(
        "ix_jobs_open_by_concurrency_key",
        "jobs",
        ["concurrency_key", "created_at"],
        postgresql_where=sa.text(f"concurrency_key IS NOT NULL AND status IN {OPEN}"),
    )
    op.execute(
        f"""
        CREATE FUNCTION flowbeat_let_in(
            slot_key text, slot_limit int, only_job uuid, sent_at timestamptz
        )
        RETURNS SETOF uuid LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_advisory_xact_lock(hashtextextended(slot_key, 0));
            RETURN QUERY
            WITH held AS (
                SELECT count(*) AS n FROM jobs
                 WHERE concurrency_key = slot_key AND waiting_for IS NULL AND status IN {OPEN}
            ), next AS (
                SELECT id FROM jobs
                 WHERE concurrency_key = slot_key AND waiting_for = 'concurrency'
                   AND status = 'queued'
                 ORDER BY created_at, id
                 LIMIT greatest(slot_limit - (SELECT n FROM held), 0)
            )
            UPDATE jobs SET waiting_for = NULL, dispatched_at = sent_at
              FROM next
             WHERE jobs.id = next.id AND (only_job IS NULL OR jobs.id = only_job)
            RETURNING jobs.id;
        END
        $$
        """
    )
    op.execute(
        """
        CREATE FUNCTION flowbeat_slot_notice() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('flowbeat_schedules', 'concurrency');
            RETURN NULL;
        END
        $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER jobs_slot_waiting AFTER INSERT ON jobs
        FOR EACH ROW WHEN (NEW.waiting_for IS NOT NULL)
        EXECUTE FUNCTION flowbeat_slot_notice()
        """
    )
    op.execute(
        f"""
        CREATE TRIGGER jobs_slot_freed AFTER UPDATE OF status ON jobs
        FOR EACH ROW WHEN (NEW.concurrency_key IS NOT NULL
                           AND OLD.status IN {OPEN} AND NEW.status NOT IN {OPEN})
        EXECUTE FUNCTION flowbeat_slot_notice()
        """
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER jobs_slot_freed ON jobs")
    op.execute("DROP TRIGGER jobs_slot_waiting ON jobs")
    op.execute("DROP FUNCTION flowbeat_slot_notice()")
    op.execute("DROP FUNCTION flowbeat_let_in(text, int, uuid, timestamptz)")
    op.drop_index("ix_jobs_open_by_concurrency_key", "jobs")
    op.drop_column("jobs", "waiting_for")
    op.drop_column("jobs", "concurrency_limit")
    op.drop_column("jobs", "concurrency_key")
