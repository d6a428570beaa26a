"""the beat leader lets waiting steps into their slots by their key, not by a scan of every step

``flowbeat_let_in_steps`` found the steps it lets in by ``step_runs.id``, which lost its index
when the table's primary key became the step's own (migration 0043): each let-in read every
step row ever kept (42 ms at 300,000 rows), while steps wait, several times a second. It now
finds them by the primary key (job, step, shard).

Revision ID: 0057
Revises: 0056
"""

from alembic import op

revision = "0057"
down_revision = "0056"
branch_labels = None
depends_on = None

HOLDS = """h.slot_key = k
           AND NOT (h.job_id IS NOT DISTINCT FROM job AND h.step_id IS NOT DISTINCT FROM step
                    AND h.shard = -1)
           AND ((h.status = 'running' AND h.lease_until >= at)
                OR (h.status = 'pending' AND h.slot_reserved))"""

BY_ID = """SELECT w.id FROM step_runs AS w
                         WHERE w.slot_key = k AND w.status = 'awaiting_slot'
                         ORDER BY w.slot_asked_at, w.id
                         LIMIT greatest(lim - held, 0)) AS next
                 WHERE r.id = next.id"""

BY_KEY = """SELECT w.job_id, w.step_id, w.shard FROM step_runs AS w
                         WHERE w.slot_key = k AND w.status = 'awaiting_slot'
                         ORDER BY w.slot_asked_at, w.id
                         LIMIT greatest(lim - held, 0)) AS next
                 WHERE r.job_id = next.job_id AND r.step_id = next.step_id
                   AND r.shard = next.shard"""


def _let_in_steps(found: str) -> str:
    """The function of migration 0028, the steps let in found by ``found``."""
    return f"""
        CREATE OR REPLACE FUNCTION flowbeat_let_in_steps(at timestamptz)
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
                  FROM ({found}
                RETURNING r.job_id, r.step_id::text;
            END LOOP;
        END
        $$
        """


def upgrade() -> None:
    op.execute(_let_in_steps(BY_KEY))


def downgrade() -> None:
    op.execute(_let_in_steps(BY_ID))
