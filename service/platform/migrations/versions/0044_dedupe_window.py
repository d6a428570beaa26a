"""a job's dedupe key, and the function that finds the job a new one duplicates

``jobs.dedupe_key`` is a profile's ``dedupe`` key resolved from the job's params.
``ix_jobs_dedupe`` holds only jobs that have one, open jobs first (their ``finished_at`` is
null), then the ended ones newest first, so two short range reads answer whatever the key's
history: an open job, else the newest that ended at or after ``since``.
``flowbeat_dedupe_twin`` takes a two-key advisory lock on (owner, pipeline, key) and, with a
snapshot taken after it, returns the key's open job, else its job that ended at or after
``since``, else null: the statement that calls it stores its job only on null, and holds the
lock until it commits, so two processes racing with one key store one job.

Revision ID: 0044
Revises: 0043
"""

import sqlalchemy as sa
from alembic import op

revision = "0044"
down_revision = "0043"
branch_labels = None
depends_on = None

OPEN = "('queued', 'running', 'awaiting_approval')"
DEDUPE_LOCK_SPACE = 30002


def upgrade() -> None:
    op.add_column("jobs", sa.Column("dedupe_key", sa.Text(), nullable=True))
    op.create_index(
        "ix_jobs_dedupe",
        "jobs",
        ["owner", "pipeline", "dedupe_key", sa.text("finished_at DESC")],
        postgresql_where=sa.text("dedupe_key IS NOT NULL"),
    )
    op.execute(
        f"""
        CREATE FUNCTION flowbeat_dedupe_twin(
            job_owner text, job_pipeline text, job_key text, since timestamptz
        )
        RETURNS uuid LANGUAGE plpgsql AS $$
        DECLARE
            twin uuid;
        BEGIN
            PERFORM pg_advisory_xact_lock(
                {DEDUPE_LOCK_SPACE}, hashtext(job_owner || '/' || job_pipeline || '/' || job_key)
            );
            SELECT id INTO twin FROM jobs
             WHERE owner = job_owner AND pipeline = job_pipeline AND dedupe_key = job_key
               AND finished_at IS NULL AND status IN {OPEN}
             LIMIT 1;
            IF twin IS NULL THEN
                SELECT id INTO twin FROM jobs
                 WHERE owner = job_owner AND pipeline = job_pipeline AND dedupe_key = job_key
                   AND finished_at >= since
                 ORDER BY finished_at DESC
                 LIMIT 1;
            END IF;
            RETURN twin;
        END
        $$
        """
    )


def downgrade() -> None:
    op.execute("DROP FUNCTION flowbeat_dedupe_twin(text, text, text, timestamptz)")
    op.drop_index("ix_jobs_dedupe", "jobs")
    op.drop_column("jobs", "dedupe_key")
