"""signals: what a job was sent, and the steps parked waiting for one

Revision ID: 0030
Revises: 0029
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_signals",
        sa.Column("job_id", sa.UUID(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("payload", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("sent_by", sa.String(length=128), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_signals_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "name", name=op.f("pk_job_signals")),
    )
    op.create_table(
        "signal_waits",
        sa.Column("job_id", sa.UUID(), nullable=False),
        sa.Column("step_id", sa.String(length=64), nullable=False),
        sa.Column("signal", sa.String(length=64), nullable=False),
        sa.Column("on_timeout", sa.String(length=16), nullable=False),
        sa.Column("waiting_since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("due_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("timed_out_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_signal_waits_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "step_id", name=op.f("pk_signal_waits")),
    )
    op.create_index(
        op.f("ix_signal_waits_due_at"),
        "signal_waits",
        ["due_at"],
        postgresql_where=sa.text("timed_out_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_signal_waits_due_at"), table_name="signal_waits")
    op.drop_table("signal_waits")
    op.drop_table("job_signals")
