"""fair share per queue: a job's queue, and turns taken queue by queue

A job is counted where its first step waits: a queue with no worker, whose jobs are sent and
never started, holds back only the jobs of that queue, and each queue's backlog is shared
round-robin by owner on its own.

Revision ID: 0035
Revises: 0030
"""

import sqlalchemy as sa
from alembic import op

revision = "0035"
down_revision = "0030"
branch_labels = None
depends_on = None

SENT_UNSTARTED = "status = 'queued' AND waiting_for IS NULL AND dispatched_at IS NOT NULL"

TAKE_TURNS = """
    CREATE OR REPLACE FUNCTION flowbeat_take_turns(ahead int, only_job uuid, sent_at timestamptz)
    RETURNS SETOF uuid LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_advisory_xact_lock(hashtextextended('flowbeat turns', 0));
        RETURN QUERY
        WITH sent AS (
            SELECT queue, count(*) AS n FROM jobs
             WHERE status = 'queued' AND waiting_for IS NULL AND dispatched_at IS NOT NULL
             GROUP BY queue
        ), busy AS (
            SELECT owner, queue, count(*) AS n FROM jobs
             WHERE status IN ('queued', 'running', 'awaiting_approval')
               AND waiting_for IS NULL
             GROUP BY owner, queue
        ), ranked AS (
            SELECT w.id, w.queue, w.created_at,
                   coalesce(busy.n, 0)
                   + row_number() OVER (PARTITION BY w.queue, w.owner ORDER BY w.created_at, w.id)
                   AS turn
              FROM jobs AS w LEFT JOIN busy USING (owner, queue)
             WHERE w.status = 'queued' AND w.waiting_for = 'turn'
        ), placed AS (
            SELECT id, queue,
                   row_number() OVER (PARTITION BY queue ORDER BY turn, created_at, id) AS place
              FROM ranked
        ), next AS (
            SELECT placed.id FROM placed LEFT JOIN sent USING (queue)
             WHERE placed.place <= ahead - coalesce(sent.n, 0)
        )
        UPDATE jobs SET waiting_for = NULL, dispatched_at = sent_at
          FROM next
         WHERE jobs.id = next.id AND (only_job IS NULL OR jobs.id = only_job)
        RETURNING jobs.id;
    END
    $$
"""

ONE_QUEUE_TAKE_TURNS = """
    CREATE OR REPLACE FUNCTION flowbeat_take_turns(ahead int, only_job uuid, sent_at timestamptz)
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


def upgrade() -> None:
    op.add_column(
        "jobs", sa.Column("queue", sa.String(40), server_default="default", nullable=False)
    )
    op.drop_index("ix_jobs_sent_unstarted", "jobs")
    op.create_index(
        "ix_jobs_sent_unstarted",
        "jobs",
        ["queue", "created_at"],
        postgresql_where=sa.text(SENT_UNSTARTED),
    )
    op.execute(TAKE_TURNS)


def downgrade() -> None:
    op.execute(ONE_QUEUE_TAKE_TURNS)
    op.drop_index("ix_jobs_sent_unstarted", "jobs")
    op.create_index(
        "ix_jobs_sent_unstarted", "jobs", ["created_at"], postgresql_where=sa.text(SENT_UNSTARTED)
    )
    op.drop_column("jobs", "queue")
