"""taking turns: jobs held back while enough are sent ahead, let in round-robin by owner

An owner's turn counts the jobs it has open and let in already: one whose jobs run or wait in
the queue goes after one with none, however old its waiting jobs are.

Revision ID: 0027
Revises: 0025
"""

import sqlalchemy as sa
from alembic import op

revision = "0027"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_jobs_sent_unstarted",
        "jobs",
        ["created_at"],
        postgresql_where=sa.text(
            "status = 'queued' AND waiting_for IS NULL AND dispatched_at IS NOT NULL"
        ),
    )
    op.create_index(
        "ix_jobs_waiting_turn",
        "jobs",
        ["owner", "created_at"],
        postgresql_where=sa.text("status = 'queued' AND waiting_for = 'turn'"),
    )
    op.execute(
        """
        CREATE FUNCTION flowbeat_take_turns(ahead int, only_job uuid, sent_at timestamptz)
        RETURNS SETOF uuid LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_advisory_xact_lock(hashtextextended('flowbeat turns', 0));
            RETURN QUERY
            WITH sent AS (
                SELECT count(*) AS n FROM (
                    SELECT 1 FROM jobs
                     WHERE status = 'queued' AND waiting_for IS NULL
                       AND dispatched_at IS NOT NULL
                     LIMIT greatest(ahead, 0)
                ) AS ahead_of_them
            ), busy AS (
                SELECT owner, count(*) AS n FROM jobs
                 WHERE status IN ('queued', 'running', 'awaiting_approval')
                   AND waiting_for IS NULL
                 GROUP BY owner
            ), ranked AS (
                SELECT w.id, w.created_at,
                       coalesce(busy.n, 0)
                       + row_number() OVER (PARTITION BY w.owner ORDER BY w.created_at, w.id)
                       AS turn
                  FROM jobs AS w LEFT JOIN busy USING (owner)
                 WHERE w.status = 'queued' AND w.waiting_for = 'turn'
            ), next AS (
                SELECT id FROM ranked
                 ORDER BY turn, created_at, id
                 LIMIT greatest(ahead - (SELECT n FROM sent), 0)
            )
            UPDATE jobs SET waiting_for = NULL, dispatched_at = sent_at
              FROM next
             WHERE jobs.id = next.id AND (only_job IS NULL OR jobs.id = only_job)
            RETURNING jobs.id;
        END
        $$
        """
    )


def downgrade() -> None:
    op.execute("DROP FUNCTION flowbeat_take_turns(int, uuid, timestamptz)")
    op.drop_index("ix_jobs_waiting_turn", "jobs")
    op.drop_index("ix_jobs_sent_unstarted", "jobs")
