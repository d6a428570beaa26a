"""a statement of the step path logs its events in one row

``job_events.more`` holds the events a row's statement logged before its last, which its own
columns hold, numbered up to the row's ``seq``: a claim that starts its job, or a checkpoint
that claims the next step or succeeds the job, writes one row and three index entries for its
two events, not two and six (ADR 20). Rows written otherwise keep one event and no ``more``.

Revision ID: 0050
Revises: 0049
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0050"
down_revision = "0049"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("job_events", sa.Column("more", JSONB(), nullable=True))


def downgrade() -> None:
    op.execute(
        """
        INSERT INTO job_events (job_id, seq, kind, step_id, data, created_at)
        SELECT e.job_id, e.seq - jsonb_array_length(e.more) + m.i - 1, m.ev ->> 'kind',
               m.ev ->> 'step_id', m.ev -> 'data', e.created_at
          FROM job_events AS e,
               jsonb_array_elements(e.more) WITH ORDINALITY AS m(ev, i)
         WHERE e.more IS NOT NULL
        """
    )
    op.drop_column("job_events", "more")
