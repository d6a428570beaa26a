"""jobs, steps, checkpoints, api keys

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("secret_hash", sa.String(length=64), nullable=False),
        sa.Column("scopes", postgresql.ARRAY(sa.String(length=16)), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("prefix", name=op.f("uq_api_keys_prefix")),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=False),
        sa.Column("pipeline", sa.String(length=64), nullable=False),
        sa.Column("profile", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("profile_hash", sa.String(length=64), nullable=False),
        sa.Column("params", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("status", sa.String(length=24), nullable=False),
        sa.Column("trigger", sa.String(length=24), nullable=False),
        sa.Column("parent_job_id", sa.UUID(), nullable=True),
        sa.Column("idempotency_key", sa.String(length=256), nullable=True),
        sa.Column("request_hash", sa.String(length=64), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("dispatched_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("result", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("error", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.ForeignKeyConstraint(
            ["parent_job_id"],
            ["jobs.id"],
            name=op.f("fk_jobs_parent_job_id_jobs"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sa.UniqueConstraint("owner", "idempotency_key", name=op.f("uq_jobs_owner_idempotency_key")),
    )
    op.create_index(op.f("ix_jobs_created_at_id"), "jobs", ["created_at", "id"], unique=False)
    op.create_index(
        op.f("ix_jobs_pipeline_created_at"), "jobs", ["pipeline", "created_at"], unique=False
    )
    op.create_index(
        op.f("ix_jobs_status_created_at"), "jobs", ["status", "created_at"], unique=False
    )
    op.create_table(
        "step_checkpoints",
        sa.Column("job_id", sa.UUID(), nullable=False),
        sa.Column("step_id", sa.String(length=64), nullable=False),
        sa.Column("shard", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("output", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
            name=op.f("fk_step_checkpoints_job_id_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_id", "step_id", "shard", name=op.f("pk_step_checkpoints")),
    )
    op.create_table(
        "step_runs",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.UUID(), nullable=False),
        sa.Column("step_id", sa.String(length=64), nullable=False),
        sa.Column("shard", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=24), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("lease_token", sa.String(length=64), nullable=True),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("task_id", sa.String(length=64), nullable=True),
        sa.Column("item", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("depends_on", postgresql.ARRAY(sa.String(length=64)), nullable=False),
        sa.Column("inputs_from", postgresql.ARRAY(sa.String(length=64)), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("error", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_step_runs_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_step_runs")),
        sa.UniqueConstraint(
            "job_id", "step_id", "shard", name=op.f("uq_step_runs_job_id_step_id_shard")
        ),
    )
    op.create_index(
        op.f("ix_step_runs_status_lease_until"),
        "step_runs",
        ["status", "lease_until"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_step_runs_status_lease_until"), table_name="step_runs")
    op.drop_table("step_runs")
    op.drop_table("step_checkpoints")
    op.drop_index(op.f("ix_jobs_status_created_at"), table_name="jobs")
    op.drop_index(op.f("ix_jobs_pipeline_created_at"), table_name="jobs")
    op.drop_index(op.f("ix_jobs_created_at_id"), table_name="jobs")
    op.drop_table("jobs")
    op.drop_table("api_keys")
