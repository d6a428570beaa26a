"""rate_waits: the steps parked for a rate-limit key, in PostgreSQL

A step whose key's window (in Redis) has no room parks ``awaiting_rate`` (the lifecycle table
gains it at migrate); this row keeps its key, limit and units, its place in the key's line
(``parked_at``) and when the window is next due to have room (``wake_at``), for the beat
leader's let-in. A Redis flush loses the windows, never a parked step.

Revision ID: 0046
Revises: 0045
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0046"
down_revision = "0045"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rate_waits",
        sa.Column("job_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("step_id", sa.String(length=64), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("rate_limit", sa.Integer(), nullable=False),
        sa.Column("window_s", sa.Float(), nullable=False),
        sa.Column("units", sa.Integer(), nullable=False),
        sa.Column("parked_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("wake_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_rate_waits_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "step_id", name=op.f("pk_rate_waits")),
    )
    op.create_index(op.f("ix_rate_waits_wake_at"), "rate_waits", ["wake_at"])
    op.create_index(op.f("ix_rate_waits_key"), "rate_waits", ["key"])


def downgrade() -> None:
    op.drop_index(op.f("ix_rate_waits_key"), table_name="rate_waits")
    op.drop_index(op.f("ix_rate_waits_wake_at"), table_name="rate_waits")
    op.drop_table("rate_waits")
