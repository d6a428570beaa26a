"""backfills: a schedule's fires over a past range, paced, with their fire records

- ``backfills`` holds each backfill's range, pacing (``max_active``), cursor and status, so the
  scheduler leader that tops it up after a failover goes on where the last one stopped.
- ``schedule_fires.backfill_id`` names the backfill that took a fire; the same unique
  (schedule, fire time) fences it against the schedule's own fires and other backfills.

Revision ID: 0045
Revises: 0044
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0045"
down_revision = "0044"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "backfills",
        sa.Column("id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("schedule_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=False),
        sa.Column("pipeline", sa.String(length=64), nullable=False),
        sa.Column("range_from", sa.DateTime(timezone=True), nullable=False),
        sa.Column("range_to", sa.DateTime(timezone=True), nullable=False),
        sa.Column("cron", sa.String(length=200), nullable=False),
        sa.Column("timezone", sa.String(length=64), nullable=False),
        sa.Column("max_active", sa.Integer(), nullable=False),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("cursor", sa.DateTime(timezone=True), nullable=True),
        sa.Column("skipped", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("created_by", sa.String(length=200), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("max_active >= 1", name=op.f("ck_backfills_max_active")),
        sa.CheckConstraint("range_from < range_to", name=op.f("ck_backfills_range")),
        sa.ForeignKeyConstraint(
            ["schedule_id"],
            ["schedules.id"],
            name=op.f("fk_backfills_schedule_id_schedules"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_backfills")),
    )
    op.create_index(op.f("ix_backfills_schedule_id"), "backfills", ["schedule_id"])
    op.create_index(op.f("ix_backfills_status"), "backfills", ["status"])
    op.add_column(
        "schedule_fires",
        sa.Column("backfill_id", postgresql.UUID(as_uuid=True), nullable=True),
    )
    op.create_foreign_key(
        op.f("fk_schedule_fires_backfill_id_backfills"),
        "schedule_fires",
        "backfills",
        ["backfill_id"],
        ["id"],
        ondelete="CASCADE",
    )
    op.create_index(op.f("ix_schedule_fires_backfill_id"), "schedule_fires", ["backfill_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_schedule_fires_backfill_id"), table_name="schedule_fires")
    op.drop_constraint(
        op.f("fk_schedule_fires_backfill_id_backfills"), "schedule_fires", type_="foreignkey"
    )
    op.drop_column("schedule_fires", "backfill_id")
    op.drop_index(op.f("ix_backfills_status"), table_name="backfills")
    op.drop_index(op.f("ix_backfills_schedule_id"), table_name="backfills")
    op.drop_table("backfills")
