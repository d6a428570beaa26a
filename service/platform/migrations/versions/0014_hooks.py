"""webhook triggers: hooks bound to pipelines, and the deliveries they accepted

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "hooks",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=False),
        sa.Column("pipeline", sa.String(length=200), nullable=False),
        sa.Column("params", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("secret", sa.String(length=128), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
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
        sa.PrimaryKeyConstraint("id", name=op.f("pk_hooks")),
        sa.UniqueConstraint("name", name=op.f("uq_hooks_name")),
    )
    op.create_table(
        "hook_deliveries",
        sa.Column("hook_id", sa.UUID(), nullable=False),
        sa.Column("delivery_id", sa.String(length=128), nullable=False),
        sa.Column("job_id", sa.UUID(), nullable=True),
        sa.Column(
            "received_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["hook_id"],
            ["hooks.id"],
            name=op.f("fk_hook_deliveries_hook_id_hooks"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
            name=op.f("fk_hook_deliveries_job_id_jobs"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("hook_id", "delivery_id", name=op.f("pk_hook_deliveries")),
    )
    op.create_index(op.f("ix_hook_deliveries_received_at"), "hook_deliveries", ["received_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_hook_deliveries_received_at"), table_name="hook_deliveries")
    op.drop_table("hook_deliveries")
    op.drop_table("hooks")
