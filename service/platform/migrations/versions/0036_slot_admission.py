"""a keyed job let in by the statement that stores it, and a key's held slots counted alone

``flowbeat_slot_room`` takes the key's advisory lock and says how many slots are free, none
while a job of the key waits (it goes first): the insert that calls it stores its job let in,
or waiting, so a job whose key has room is neither updated again nor announced to the beat.
The count reads an index of the key's open jobs that are let in, at most ``limit`` entries of
it, not the jobs that wait behind them; the waiting ones have an index of their own, in the
order they are let in.

Revision ID: 0036
Revises: 0033
"""

import sqlalchemy as sa
from alembic import op

revision = "0036"
down_revision = "0033"
branch_labels = None
depends_on = None

OPEN = "('queued', 'running', 'awaiting_approval')"
HOLDING = f"concurrency_key IS NOT NULL AND waiting_for IS NULL AND status IN {OPEN}"
WAITING = "waiting_for = 'concurrency' AND status = 'queued'"

HELD = f"""SELECT count(*) FROM (
               SELECT 1 FROM jobs
                WHERE concurrency_key = slot_key AND {HOLDING}
                LIMIT greatest(slot_limit, 0)
           ) AS holders"""
"""The key's slots taken, read up to the limit from ``ix_jobs_slot_holders``."""


def upgrade() -> None:
    op.create_index(
        "ix_jobs_slot_holders", "jobs", ["concurrency_key"], postgresql_where=sa.text(HOLDING)
    )
    op.create_index(
        "ix_jobs_slot_waiting",
        "jobs",
        ["concurrency_key", "created_at", "id"],
        postgresql_where=sa.text(WAITING),
    )
    op.drop_index("ix_jobs_open_by_concurrency_key", "jobs")
    op.execute(
        f"""
        CREATE FUNCTION flowbeat_slot_room(slot_key text, slot_limit int)
        RETURNS int LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_advisory_xact_lock(hashtextextended(slot_key, 0));
            IF EXISTS (SELECT 1 FROM jobs WHERE concurrency_key = slot_key AND {WAITING}) THEN
                RETURN 0;
            END IF;
            RETURN greatest(slot_limit - ({HELD}), 0);
        END
        $$
        """
    )
    op.execute("DROP FUNCTION flowbeat_let_in(text, int, uuid, timestamptz)")
    op.execute(
        f"""
        CREATE FUNCTION flowbeat_let_in(slot_key text, slot_limit int, sent_at timestamptz)
        RETURNS SETOF uuid LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_advisory_xact_lock(hashtextextended(slot_key, 0));
            RETURN QUERY
            UPDATE jobs SET waiting_for = NULL, dispatched_at = sent_at
              FROM (SELECT id FROM jobs
                     WHERE concurrency_key = slot_key AND {WAITING}
                     ORDER BY created_at, id
                     LIMIT greatest(slot_limit - ({HELD}), 0)) AS next
             WHERE jobs.id = next.id
            RETURNING jobs.id;
        END
        $$
        """
    )


def downgrade() -> None:
    op.execute("DROP FUNCTION flowbeat_let_in(text, int, timestamptz)")
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
    op.execute("DROP FUNCTION flowbeat_slot_room(text, int)")
    op.create_index(
        "ix_jobs_open_by_concurrency_key",
        "jobs",
        ["concurrency_key", "created_at"],
        postgresql_where=sa.text(f"concurrency_key IS NOT NULL AND status IN {OPEN}"),
    )
    op.drop_index("ix_jobs_slot_waiting", "jobs")
    op.drop_index("ix_jobs_slot_holders", "jobs")
