"""loop rounds: the round a step row is in, and every finished round kept

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "step_runs", sa.Column("round", sa.Integer(), server_default=sa.text("1"), nullable=False)
    )
    op.create_table(
        "step_rounds",
        sa.Column("job_id", sa.UUID(), nullable=False),
        sa.Column("step_id", sa.String(length=64), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=24), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("error", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("output", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_step_rounds_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "step_id", "round", name=op.f("pk_step_rounds")),
    )


def downgrade() -> None:
    op.drop_table("step_rounds")
    op.drop_column("step_runs", "round")
