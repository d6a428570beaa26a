"""a step that takes a concurrency slot records as its start the moment it took it

A keyed step's ``started_at`` was its claim's time, taken before it asked for a slot. A step
whose holder ended between the two then showed a start before the holder's end: two steps of
a key of limit 1 seemed to run at once, though the second ran nothing until it had the slot.
The slot is granted under the key's advisory lock, after the holder's end is committed, so the
database's clock read there orders the two starts and ends truly.

Revision ID: 0056
Revises: 0055
"""

from alembic import op

revision = "0056"
down_revision = "0055"
branch_labels = None
depends_on = None

HOLDS = """h.slot_key = k
           AND NOT (h.job_id IS NOT DISTINCT FROM job AND h.step_id IS NOT DISTINCT FROM step
                    AND h.shard = -1)
           AND ((h.status = 'running' AND h.lease_until >= at)
                OR (h.status = 'pending' AND h.slot_reserved))"""


def _take_step_slot(granted: str) -> str:
    """The function of migration 0028, ``granted`` set on the step's row with its slot."""
    return f"""
        CREATE OR REPLACE FUNCTION flowbeat_take_step_slot(
            k text, lim int, job uuid, step text, at timestamptz
        ) RETURNS boolean LANGUAGE plpgsql AS $$
        DECLARE
            held int;
        BEGIN
            PERFORM pg_advisory_xact_lock(hashtextextended(k, 0));
            UPDATE step_runs SET slot_reserved = false, slot_key = k{granted}
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
                UPDATE step_runs SET slot_key = k, slot_limit = lim{granted}
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


def upgrade() -> None:
    op.execute(_take_step_slot(", started_at = clock_timestamp()"))


def downgrade() -> None:
    op.execute(_take_step_slot(""))
