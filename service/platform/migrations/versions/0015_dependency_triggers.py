"""dependency triggers: which saved pipelines start on another's success, and a queue of the
successes that start something

Revision ID: 0015
Revises: 0014

A job's success is queued by a trigger in the transaction that records it, only when a
pipeline of its owner waits for it, so the success and the promise of its downstream jobs
commit together; the elected beat replica then creates those jobs, fenced per (upstream job,
downstream pipeline) as schedule fires are, and is woken on the schedules channel.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

_QUEUE_SUCCESS = """
CREATE FUNCTION flowbeat_queue_dependents() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pipeline_triggers
                WHERE owner = NEW.owner AND upstream = NEW.pipeline) THEN
        INSERT INTO dependency_queue (upstream_job_id) VALUES (NEW.id) ON CONFLICT DO NOTHING;
        PERFORM pg_notify('flowbeat_schedules', 'dependency');
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_queue_dependents AFTER UPDATE OF status ON jobs FOR EACH ROW
    WHEN (NEW.status = 'succeeded' AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION flowbeat_queue_dependents();
"""


def upgrade() -> None:
    op.add_column(
        "jobs",
        sa.Column("trigger_data", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )
    op.create_table(
        "pipeline_triggers",
        sa.Column("owner", sa.String(length=128), nullable=False),
        sa.Column("upstream", sa.String(length=64), nullable=False),
        sa.Column("downstream", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint(
            "owner", "upstream", "downstream", name=op.f("pk_pipeline_triggers")
        ),
    )
    op.create_table(
        "dependency_queue",
        sa.Column("upstream_job_id", sa.UUID(), nullable=False),
        sa.Column(
            "queued_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.PrimaryKeyConstraint("upstream_job_id", name=op.f("pk_dependency_queue")),
    )
    op.create_table(
        "dependency_fires",
        sa.Column("upstream_job_id", sa.UUID(), nullable=False),
        sa.Column("downstream", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.UUID(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
            name=op.f("fk_dependency_fires_job_id_jobs"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("upstream_job_id", "downstream", name=op.f("pk_dependency_fires")),
    )
    op.execute(_QUEUE_SUCCESS)


def downgrade() -> None:
    op.execute("DROP TRIGGER jobs_queue_dependents ON jobs")
    op.execute("DROP FUNCTION flowbeat_queue_dependents()")
    op.drop_table("dependency_fires")
    op.drop_table("dependency_queue")
    op.drop_table("pipeline_triggers")
    op.drop_column("jobs", "trigger_data")
