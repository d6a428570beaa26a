"""a job's priority, from its submission or its profile, for the order its messages are taken

Revision ID: 0021
Revises: 0020
"""

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "jobs", sa.Column("priority", sa.SmallInteger(), server_default="0", nullable=False)
    )
    op.create_check_constraint(op.f("ck_jobs_priority"), "jobs", "priority BETWEEN 0 AND 9")


def downgrade() -> None:
    op.drop_constraint(op.f("ck_jobs_priority"), "jobs")
    op.drop_column("jobs", "priority")
