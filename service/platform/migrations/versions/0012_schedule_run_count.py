"""schedules count the runs they created, so old fire records can be pruned

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "schedules",
        sa.Column("run_count", sa.Integer(), server_default=sa.text("0"), nullable=False),
    )
    op.execute(
        """
        UPDATE schedules AS s SET run_count = f.n
          FROM (SELECT schedule_id, count(*) AS n FROM schedule_fires
                 WHERE outcome = 'created' GROUP BY schedule_id) AS f
         WHERE s.id = f.schedule_id
        """
    )


def downgrade() -> None:
    op.drop_column("schedules", "run_count")
