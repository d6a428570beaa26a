"""several schedules per pipeline: a name unique per owner and pipeline, and a priority

Revision ID: 0023
Revises: 0022
"""

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("schedules", sa.Column("name", sa.String(length=64), nullable=True))
    op.add_column("schedules", sa.Column("priority", sa.SmallInteger(), nullable=True))
    op.create_check_constraint(
        op.f("ck_schedules_priority"), "schedules", "priority BETWEEN 0 AND 9"
    )
    op.drop_constraint(op.f("uq_schedules_owner_pipeline"), "schedules", type_="unique")
    op.create_unique_constraint(
        op.f("uq_schedules_owner_pipeline_name"), "schedules", ["owner", "pipeline", "name"]
    )


def downgrade() -> None:
    """Refused by PostgreSQL while a pipeline has several schedules: which to drop is the
    operator's call, not the migration's."""
    op.drop_constraint(op.f("uq_schedules_owner_pipeline_name"), "schedules", type_="unique")
    op.create_unique_constraint(
        op.f("uq_schedules_owner_pipeline"), "schedules", ["owner", "pipeline"]
    )
    op.drop_constraint(op.f("ck_schedules_priority"), "schedules")
    op.drop_column("schedules", "priority")
    op.drop_column("schedules", "name")
