"""step concurrency keys: a step's slot, what it waits in, and a wake-up when one frees

Revision ID: 0028
Revises: 0027
"""

import sqlalchemy as sa
from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None

HOLDS = """h.slot_key = k
           AND NOT (h.job_id IS NOT DISTINCT FROM job AND h.step_id IS NOT DISTINCT FROM step
                    AND h.shard = -1)
           AND ((h.status = 'running' AND h.lease_until >= at)
                OR (h.status = 'pending' AND h.slot_reserved))"""
"""The steps of key ``k`` holding a slot: running under a live lease, or let in and kept one;
but for the step ``job``/``step`` asking (none when the beat asks)."""


def upgrade() -> None:
    op.add_column("step_runs", sa.Column("slot_key", sa.Text(), nullable=True))
    op.add_column("step_runs", sa.Column("slot_limit", sa.Integer(), nullable=True))
    op.add_column("step_runs", sa.Column("slot_asked_at", sa.DateTime(timezone=True)))
    op.add_column(
        "step_runs",
        sa.Column("slot_reserved", sa.Boolean(), server_default=sa.false(), nullable=False),
    )
    op.create_index(
        "ix_step_runs_slots",
        "step_runs",
        ["slot_key", "status"],
        postgresql_where=sa.text(
            "slot_key IS NOT NULL AND status IN ('running', 'pending', 'awaiting_slot')"
        ),
    )
    op.execute(
        f"""
        CREATE FUNCTION flowbeat_take_step_slot(
            k text, lim int, job uuid, step text, at timestamptz
        ) RETURNS boolean LANGUAGE plpgsql AS $$
        DECLARE
            held int;
        BEGIN
            PERFORM pg_advisory_xact_lock(hashtextextended(k, 0));
            UPDATE step_runs SET slot_reserved = false, slot_key = k
             WHERE job_id = job AND step_id = step AND shard = -1 AND slot_reserved;
            IF FOUND THEN
                RETURN true;
            END IF;
            SELECT count(*) INTO held FROM step_runs AS h WHERE {HOLDS};
            IF held < lim AND NOT EXISTS (
                SELECT 1 FROM step_runs
                 WHERE slot_key = k AND status = 'awaiting_slot'
                   AND NOT (job_id = job AND step_id = step AND shard = -1)
            ) THEN
                UPDATE step_runs SET slot_key = k, slot_limit = lim
                 WHERE job_id = job AND step_id = step AND shard = -1;
                RETURN true;
            END IF;
            UPDATE step_runs
               SET status = 'awaiting_slot', slot_key = k, slot_limit = lim,
                   slot_asked_at = coalesce(slot_asked_at, at), attempts = attempts - 1,
                   lease_token = NULL, lease_until = NULL, started_at = NULL
             WHERE job_id = job AND step_id = step AND shard = -1;
            RETURN false;
        END
        $$
        """
    )
    op.execute(
        f"""
        CREATE FUNCTION flowbeat_let_in_steps(at timestamptz)
        RETURNS TABLE (let_job uuid, let_step text) LANGUAGE plpgsql AS $$
        DECLARE
            k text;
            lim int;
            held int;
            job uuid := NULL;
            step text := NULL;
        BEGIN
            FOR k, lim IN
                SELECT DISTINCT ON (s.slot_key) s.slot_key, s.slot_limit FROM step_runs AS s
                 WHERE s.status = 'awaiting_slot'
                 ORDER BY s.slot_key, s.slot_asked_at DESC
            LOOP
                PERFORM pg_advisory_xact_lock(hashtextextended(k, 0));
                SELECT count(*) INTO held FROM step_runs AS h WHERE {HOLDS};
                RETURN QUERY
                UPDATE step_runs AS r SET status = 'pending', slot_reserved = true
                  FROM (SELECT w.id FROM step_runs AS w
                         WHERE w.slot_key = k AND w.status = 'awaiting_slot'
                         ORDER BY w.slot_asked_at, w.id
                         LIMIT greatest(lim - held, 0)) AS next
                 WHERE r.id = next.id
                RETURNING r.job_id, r.step_id::text;
            END LOOP;
        END
        $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER step_runs_slot_freed AFTER UPDATE OF status ON step_runs
        FOR EACH ROW WHEN (OLD.slot_key IS NOT NULL AND OLD.status = 'running'
                           AND NEW.status <> 'running')
        EXECUTE FUNCTION flowbeat_slot_notice()
        """
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER step_runs_slot_freed ON step_runs")
    op.execute("DROP FUNCTION flowbeat_let_in_steps(timestamptz)")
    op.execute("DROP FUNCTION flowbeat_take_step_slot(text, int, uuid, text, timestamptz)")
    op.drop_index("ix_step_runs_slots", "step_runs")
    op.drop_column("step_runs", "slot_reserved")
    op.drop_column("step_runs", "slot_asked_at")
    op.drop_column("step_runs", "slot_limit")
    op.drop_column("step_runs", "slot_key")
