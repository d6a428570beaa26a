"""step_runs.wake_at: when a sleeping ``wait`` step is due, indexed over sleeping rows only

The ``sleeping`` status and its moves need no DDL: the lifecycle trigger's body is rewritten
from ``service.platform.states`` at every migration to head.

Revision ID: 0029
Revises: 0028
"""

import sqlalchemy as sa
from alembic import op

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("step_runs", sa.Column("wake_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        "ix_step_runs_wake_at",
        "step_runs",
        ["wake_at"],
        unique=False,
        postgresql_where=sa.text("status = 'sleeping'"),
    )


def downgrade() -> None:
    op.drop_index("ix_step_runs_wake_at", table_name="step_runs")
    op.drop_column("step_runs", "wake_at")
