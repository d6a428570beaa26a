"""result items, job events, diff counts and notice settings on jobs

Revision ID: 0004
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("item_count", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("new_count", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("removed_count", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("previous_job_id", sa.UUID(), nullable=True))
    op.add_column(
        "jobs",
        sa.Column("diff_mode", sa.Boolean(), server_default=sa.false(), nullable=False),
    )
    op.add_column("jobs", sa.Column("notify_url", sa.Text(), nullable=True))
    op.create_foreign_key(
        op.f("fk_jobs_previous_job_id_jobs"),
        "jobs",
        "jobs",
        ["previous_job_id"],
        ["id"],
        ondelete="SET NULL",
    )
    op.create_table(
        "result_items",
        sa.Column("job_id", sa.UUID(), nullable=False),
        sa.Column("item_key", sa.Text(), nullable=False),
        sa.Column("item", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_result_items_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "item_key", name=op.f("pk_result_items")),
    )
    op.create_table(
        "job_events",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.UUID(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("data", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_events_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_events")),
    )
    op.create_index(op.f("ix_job_events_job_id_id"), "job_events", ["job_id", "id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_job_events_job_id_id"), table_name="job_events")
    op.drop_table("job_events")
    op.drop_table("result_items")
    op.drop_constraint(op.f("fk_jobs_previous_job_id_jobs"), "jobs", type_="foreignkey")
    for column in ("notify_url", "diff_mode", "previous_job_id", "removed_count", "new_count"):
        op.drop_column("jobs", column)
    op.drop_column("jobs", "item_count")
