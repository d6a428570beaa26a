"""partial index of the shards a fan-out still has to run

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_step_runs_open_shards",
        "step_runs",
        ["job_id", "step_id", "shard"],
        unique=False,
        postgresql_where=sa.text("shard >= 0 AND status IN ('pending', 'retrying', 'running')"),
    )


def downgrade() -> None:
    op.drop_index("ix_step_runs_open_shards", table_name="step_runs")
