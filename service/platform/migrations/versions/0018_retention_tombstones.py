"""tombstones of pruned jobs, and the indexes retention reads and deletes through

Revision ID: 0018
Revises: 0017
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pruned_jobs",
        sa.Column("job_id", sa.UUID(), nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=False),
        sa.Column("pipeline", sa.String(length=64), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("pruned_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_pruned_jobs")),
    )
    op.create_index(op.f("ix_pruned_jobs_pruned_at"), "pruned_jobs", ["pruned_at"])
    op.execute(
        "CREATE INDEX ix_jobs_finished_at ON jobs (finished_at) WHERE finished_at IS NOT NULL"
    )
    op.create_index(
        op.f("ix_jobs_owner_pipeline_created_at_id"),
        "jobs",
        ["owner", "pipeline", "created_at", "id"],
    )
    op.execute(
        "CREATE INDEX ix_jobs_previous_job_id ON jobs (previous_job_id) "
        "WHERE previous_job_id IS NOT NULL"
    )
    op.execute(
        "CREATE INDEX ix_jobs_parent_job_id ON jobs (parent_job_id) WHERE parent_job_id IS NOT NULL"
    )


def downgrade() -> None:
    for name in (
        "ix_jobs_parent_job_id",
        "ix_jobs_previous_job_id",
        "ix_jobs_owner_pipeline_created_at_id",
        "ix_jobs_finished_at",
    ):
        op.drop_index(name, table_name="jobs")
    op.drop_index(op.f("ix_pruned_jobs_pruned_at"), table_name="pruned_jobs")
    op.drop_table("pruned_jobs")
