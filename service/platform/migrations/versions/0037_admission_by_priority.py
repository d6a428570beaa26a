"""jobs held back are let in by priority, then age: each owner's turn, and a key's free slots

Before, a job waiting its turn (fair share) or a slot of its concurrency key was let in oldest
first whatever its priority, so an urgent job waited behind the backlog held back before it.
An owner's turn now goes to that owner's most urgent waiting job, the oldest of those first;
across owners the round-robin stands, the more urgent first only among owners whose turn is
the same. A key's free slots go the same way. The waiting jobs' indexes are in that order, so
each owner's (and each key's) jobs are read in it rather than sorted.

Revision ID: 0037
Revises: 0036
"""

import sqlalchemy as sa
from alembic import op

revision = "0037"
down_revision = "0036"
branch_labels = None
depends_on = None

BY_PRIORITY = "priority DESC, created_at, id"
BY_AGE = "created_at, id"
WAITING_TURN = "status = 'queued' AND waiting_for = 'turn'"
WAITING_SLOT = "waiting_for = 'concurrency' AND status = 'queued'"
HELD = """SELECT count(*) FROM (
               SELECT 1 FROM jobs
                WHERE concurrency_key = slot_key AND concurrency_key IS NOT NULL
                  AND waiting_for IS NULL AND status IN ('queued', 'running', 'awaiting_approval')
                LIMIT greatest(slot_limit, 0)
           ) AS holders"""


def _take_turns(order: str) -> str:
    """Migration 0035's function with each owner's waiting jobs, and the jobs of one round,
    taken in ``order``."""
    return f"""
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
        ), waiting AS (
            SELECT id, queue, owner, priority, created_at,
                   row_number() OVER (PARTITION BY queue, owner ORDER BY {order}) AS nth
              FROM jobs
             WHERE {WAITING_TURN}
        ), ranked AS (
            SELECT w.id, w.queue, w.priority, w.created_at, coalesce(busy.n, 0) + w.nth AS turn
              FROM waiting AS w LEFT JOIN busy USING (owner, queue)
        ), placed AS (
            SELECT id, queue,
                   row_number() OVER (PARTITION BY queue ORDER BY turn, {order}) AS place
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


def _let_in(order: str) -> str:
    """Migration 0036's function with a key's waiting jobs let in in ``order``."""
    return f"""
    CREATE OR REPLACE FUNCTION flowbeat_let_in(slot_key text, slot_limit int, sent_at timestamptz)
    RETURNS SETOF uuid LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_advisory_xact_lock(hashtextextended(slot_key, 0));
        RETURN QUERY
        UPDATE jobs SET waiting_for = NULL, dispatched_at = sent_at
          FROM (SELECT id FROM jobs
                 WHERE concurrency_key = slot_key AND {WAITING_SLOT}
                 ORDER BY {order}
                 LIMIT greatest(slot_limit - ({HELD}), 0)) AS next
         WHERE jobs.id = next.id
        RETURNING jobs.id;
    END
    $$
    """


def _waiting_indexes(turn: list[str], slot: list[str]) -> None:
    op.drop_index("ix_jobs_waiting_turn", "jobs")
    op.drop_index("ix_jobs_slot_waiting", "jobs")
    op.create_index(
        "ix_jobs_waiting_turn", "jobs", [sa.text(c) for c in turn], postgresql_where=WAITING_TURN
    )
    op.create_index(
        "ix_jobs_slot_waiting", "jobs", [sa.text(c) for c in slot], postgresql_where=WAITING_SLOT
    )


def upgrade() -> None:
    _waiting_indexes(
        ["queue", "owner", "priority DESC", "created_at", "id"],
        ["concurrency_key", "priority DESC", "created_at", "id"],
    )
    op.execute(_take_turns(BY_PRIORITY))
    op.execute(_let_in(BY_PRIORITY))


def downgrade() -> None:
    op.execute(_let_in(BY_AGE))
    op.execute(_take_turns(BY_AGE))
    _waiting_indexes(["owner", "created_at"], ["concurrency_key", "created_at", "id"])
