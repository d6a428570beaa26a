"""child_calls: the child job each attempt of a pipeline.run step started, and the wake-up of
the beat leader when a child ends or a parent waiting for one is cancelled

Revision ID: 0032
Revises: 0031
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0032"
down_revision = "0031"
branch_labels = None
depends_on = None

_NOTIFY = """
CREATE FUNCTION flowbeat_child_call_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('flowbeat_schedules', 'child');
    RETURN NULL;
END $$;
CREATE TRIGGER jobs_child_ended AFTER UPDATE OF status ON jobs FOR EACH ROW
    WHEN (NEW.trigger = 'parent' AND OLD.status IS DISTINCT FROM NEW.status
          AND NEW.status IN ('succeeded', 'failed', 'cancelled'))
    EXECUTE FUNCTION flowbeat_child_call_moved();
CREATE TRIGGER step_runs_parent_closed AFTER UPDATE OF status ON step_runs FOR EACH ROW
    WHEN (OLD.status = 'awaiting_child' AND NEW.status = 'cancelled')
    EXECUTE FUNCTION flowbeat_child_call_moved();
"""


def upgrade() -> None:
    op.create_table(
        "child_calls",
        sa.Column("job_id", sa.UUID(), nullable=False),
        sa.Column("step_id", sa.String(length=64), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("pipeline", sa.String(length=64), nullable=False),
        sa.Column("params", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("wait", sa.Boolean(), nullable=False),
        sa.Column("started", sa.Boolean(), nullable=False),
        sa.Column("child_job_id", sa.UUID(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_child_calls_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["child_job_id"],
            ["jobs.id"],
            name=op.f("fk_child_calls_child_job_id_jobs"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("job_id", "step_id", "attempt", name=op.f("pk_child_calls")),
    )
    op.create_index(op.f("ix_child_calls_child_job_id"), "child_calls", ["child_job_id"])
    op.create_index(
        "ix_child_calls_unstarted",
        "child_calls",
        ["created_at"],
        postgresql_where=sa.text("NOT started"),
    )
    op.execute(_NOTIFY)


def downgrade() -> None:
    op.execute("DROP TRIGGER step_runs_parent_closed ON step_runs")
    op.execute("DROP TRIGGER jobs_child_ended ON jobs")
    op.execute("DROP FUNCTION flowbeat_child_call_moved()")
    op.drop_index("ix_child_calls_unstarted", table_name="child_calls")
    op.drop_index(op.f("ix_child_calls_child_job_id"), table_name="child_calls")
    op.drop_table("child_calls")
