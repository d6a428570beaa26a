"""an index of each owner's open jobs, for the cap on them

Revision ID: 0013
Revises: 0012
"""

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "CREATE INDEX ix_jobs_open_by_owner ON jobs (owner) "
        "WHERE status IN ('queued', 'running', 'awaiting_approval')"
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_open_by_owner", table_name="jobs")
