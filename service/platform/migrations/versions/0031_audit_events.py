"""audit_events: who changed what, through which channel, recorded with the change

Revision ID: 0031
Revises: 0035
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0031"
down_revision = "0035"
branch_labels = None
depends_on = None

_INDEXES = (
    ("at", "id"),
    ("target_kind", "target_id", "at"),
    ("actor", "at"),
    ("owner", "at"),
    ("action", "at"),
)


def upgrade() -> None:
    op.create_table(
        "audit_events",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column(
            "at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column("channel", sa.String(length=8), nullable=False),
        sa.Column("source", sa.String(length=128), nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=False),
        sa.Column("action", sa.String(length=32), nullable=False),
        sa.Column("target_kind", sa.String(length=16), nullable=False),
        sa.Column("target_id", sa.String(length=256), nullable=False),
        sa.Column(
            "detail",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "channel IN ('api', 'cli', 'mcp', 'ui')", name=op.f("ck_audit_events_channel")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_events")),
    )
    for columns in _INDEXES:
        op.create_index(op.f(f"ix_audit_events_{'_'.join(columns)}"), "audit_events", columns)


def downgrade() -> None:
    for columns in _INDEXES:
        op.drop_index(op.f(f"ix_audit_events_{'_'.join(columns)}"), table_name="audit_events")
    op.drop_table("audit_events")
