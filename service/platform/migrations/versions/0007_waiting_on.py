"""count of unsettled upstream steps, the fence of per-edge dispatch

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "step_runs",
        sa.Column("waiting_on", sa.Integer(), server_default=sa.text("0"), nullable=False),
    )
    op.execute(
        """
        UPDATE step_runs AS s
           SET waiting_on = (
               SELECT count(*) FROM step_runs AS u
                WHERE u.job_id = s.job_id AND u.shard = -1 AND u.step_id = ANY(s.depends_on)
                  AND u.status NOT IN ('succeeded', 'failed', 'skipped', 'cancelled'))
         WHERE s.shard = -1 AND cardinality(s.depends_on) > 0
           AND s.status NOT IN ('succeeded', 'failed', 'skipped', 'cancelled')
        """
    )


def downgrade() -> None:
    op.drop_column("step_runs", "waiting_on")
