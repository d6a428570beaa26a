"""job deadlines: when an open job is failed as job_timeout, and a schedule's own timeout_s

Revision ID: 0024
Revises: 0023
"""

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

_OPEN_DEADLINE = "deadline_at IS NOT NULL AND status IN ('queued', 'running', 'awaiting_approval')"


def upgrade() -> None:
    op.add_column("jobs", sa.Column("deadline_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        "ix_jobs_open_deadline",
        "jobs",
        ["deadline_at"],
        postgresql_where=sa.text(_OPEN_DEADLINE),
    )
    op.add_column("schedules", sa.Column("timeout_s", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("schedules", "timeout_s")
    op.drop_index("ix_jobs_open_deadline", table_name="jobs")
    op.drop_column("jobs", "deadline_at")
