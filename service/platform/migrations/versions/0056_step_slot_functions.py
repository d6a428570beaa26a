"""a keyed step starts when it takes its slot, and the leader lets waiting steps in by their key

- ``flowbeat_take_step_slot``: a keyed step's ``started_at`` was its claim's time, taken
  before it asked for a slot. A step whose holder ended between the two then showed a start
  before the holder's end: two steps of a key of limit 1 seemed to run at once, though the
  second ran nothing until it had the slot. The slot is granted under the key's advisory
  lock, after the holder's end is committed, so the database's clock read there orders the
  two starts and ends truly.
- ``flowbeat_let_in_steps`` found the steps it lets in by ``step_runs.id``, which lost its
  index when the table's primary key became the step's own (migration 0043): each let-in read
  every step row ever kept (42 ms at 300,000 rows), while steps wait, several times a second.
  It finds them by the primary key (job, step, shard).

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
"""As migration 0028 has it."""

GRANTED_AT = ", started_at = clock_timestamp()"

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
    op.execute(_take_step_slot(GRANTED_AT))
    op.execute(_let_in_steps(BY_KEY))


def downgrade() -> None:
    op.execute(_take_step_slot(""))
    op.execute(_let_in_steps(BY_ID))
