"""schedules, schedule fires, schedule columns on jobs

Revision ID: 0003
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=False),
        sa.Column("pipeline", sa.String(length=64), nullable=False),
        sa.Column("cron", sa.String(length=200), nullable=True),
        sa.Column("every_s", sa.Integer(), nullable=True),
        sa.Column("timezone", sa.String(length=64), nullable=False),
        sa.Column("params", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("overlap", sa.String(length=24), nullable=False),
        sa.Column("catchup", sa.String(length=16), nullable=False),
        sa.Column("catchup_window_s", sa.Integer(), nullable=False),
        sa.Column("jitter_s", sa.Integer(), nullable=False),
        sa.Column("diff_mode", sa.Boolean(), nullable=False),
        sa.Column("notify_url", sa.Text(), nullable=True),
        sa.Column("next_fire_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("buffered_fire_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_fire_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_job_id", sa.UUID(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_schedules")),
        sa.UniqueConstraint("owner", "pipeline", name=op.f("uq_schedules_owner_pipeline")),
    )
    op.create_index(
        op.f("ix_schedules_enabled_next_fire_at"), "schedules", ["enabled", "next_fire_at"]
    )
    op.add_column("jobs", sa.Column("schedule_id", sa.UUID(), nullable=True))
    op.add_column("jobs", sa.Column("scheduled_for", sa.DateTime(timezone=True), nullable=True))
    op.create_index(op.f("ix_jobs_schedule_id"), "jobs", ["schedule_id"])
    op.create_foreign_key(
        op.f("fk_jobs_schedule_id_schedules"),
        "jobs",
        "schedules",
        ["schedule_id"],
        ["id"],
        ondelete="SET NULL",
    )
    op.create_table(
        "schedule_fires",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("schedule_id", sa.UUID(), nullable=False),
        sa.Column("fire_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("job_id", sa.UUID(), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
            name=op.f("fk_schedule_fires_job_id_jobs"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["schedule_id"],
            ["schedules.id"],
            name=op.f("fk_schedule_fires_schedule_id_schedules"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_schedule_fires")),
        sa.UniqueConstraint(
            "schedule_id", "fire_at", name=op.f("uq_schedule_fires_schedule_id_fire_at")
        ),
    )


def downgrade() -> None:
    op.drop_table("schedule_fires")
    op.drop_constraint(op.f("fk_jobs_schedule_id_schedules"), "jobs", type_="foreignkey")
    op.drop_index(op.f("ix_jobs_schedule_id"), table_name="jobs")
    op.drop_column("jobs", "scheduled_for")
    op.drop_column("jobs", "schedule_id")
    op.drop_index(op.f("ix_schedules_enabled_next_fire_at"), table_name="schedules")
    op.drop_table("schedules")
