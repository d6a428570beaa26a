"""alerts: an owner's rules, their outbox of deliveries, and the event log cursor of the matcher

Revision ID: 0039
Revises: 0036
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0039"
down_revision = "0038"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "alert_rules",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("threshold", sa.Integer(), nullable=True),
        sa.Column("pipeline", sa.String(length=200), nullable=True),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("secret", sa.String(length=128), nullable=True),
        sa.Column("format", sa.String(length=16), nullable=False),
        sa.Column("dedupe_s", sa.Integer(), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_rules")),
        sa.UniqueConstraint("owner", "name", name=op.f("uq_alert_rules_owner_name")),
    )
    op.create_table(
        "alert_deliveries",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("rule_id", sa.UUID(), nullable=False),
        sa.Column("event_key", sa.String(length=200), nullable=False),
        sa.Column("subject", sa.String(length=300), nullable=False),
        sa.Column("payload", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "status", sa.String(length=16), server_default=sa.text("'pending'"), nullable=False
        ),
        sa.Column("attempts", sa.SmallInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("suppressed", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column(
            "next_attempt_at",
            sa.DateTime(timezone=True),
            server_default=sa.func.now(),
            nullable=False,
        ),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["rule_id"],
            ["alert_rules.id"],
            name=op.f("fk_alert_deliveries_rule_id_alert_rules"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_deliveries")),
        sa.UniqueConstraint(
            "rule_id", "event_key", name=op.f("uq_alert_deliveries_rule_id_event_key")
        ),
    )
    op.create_index(
        op.f("ix_alert_deliveries_rule_id_subject_created_at"),
        "alert_deliveries",
        ["rule_id", "subject", "created_at"],
    )
    op.create_index(op.f("ix_alert_deliveries_rule_id_id"), "alert_deliveries", ["rule_id", "id"])
    op.create_index(
        "ix_alert_deliveries_due",
        "alert_deliveries",
        ["next_attempt_at"],
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.create_table(
        "alert_cursor",
        sa.Column("id", sa.SmallInteger(), autoincrement=False, nullable=False),
        sa.Column("last_event_id", sa.BigInteger(), nullable=False),
        sa.Column("gaps", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_cursor")),
    )


def downgrade() -> None:
    op.drop_table("alert_cursor")
    op.drop_index("ix_alert_deliveries_due", table_name="alert_deliveries")
    op.drop_index(op.f("ix_alert_deliveries_rule_id_id"), table_name="alert_deliveries")
    op.drop_index(
        op.f("ix_alert_deliveries_rule_id_subject_created_at"), table_name="alert_deliveries"
    )
    op.drop_table("alert_deliveries")
    op.drop_table("alert_rules")
