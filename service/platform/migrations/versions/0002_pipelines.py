"""saved pipelines and their versions; jobs record which version ran

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pipelines",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("tags", postgresql.ARRAY(sa.String(length=64)), nullable=False),
        sa.Column("shared_with", postgresql.ARRAY(sa.String(length=128)), nullable=False),
        sa.Column("current_version", sa.Integer(), nullable=False),
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
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pipelines")),
        sa.UniqueConstraint("owner", "name", name=op.f("uq_pipelines_owner_name")),
    )
    op.create_table(
        "pipeline_versions",
        sa.Column("pipeline_id", sa.UUID(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("content_hash", sa.String(length=64), nullable=False),
        sa.Column("profile", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["pipeline_id"],
            ["pipelines.id"],
            name=op.f("fk_pipeline_versions_pipeline_id_pipelines"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("pipeline_id", "version", name=op.f("pk_pipeline_versions")),
        sa.UniqueConstraint(
            "pipeline_id",
            "content_hash",
            name=op.f("uq_pipeline_versions_pipeline_id_content_hash"),
        ),
    )
    op.add_column("jobs", sa.Column("pipeline_id", sa.UUID(), nullable=True))
    op.add_column("jobs", sa.Column("pipeline_version", sa.Integer(), nullable=True))
    op.create_index(op.f("ix_jobs_pipeline_id"), "jobs", ["pipeline_id"], unique=False)
    op.create_foreign_key(
        op.f("fk_jobs_pipeline_id_pipelines"),
        "jobs",
        "pipelines",
        ["pipeline_id"],
        ["id"],
        ondelete="SET NULL",
    )


def downgrade() -> None:
    op.drop_constraint(op.f("fk_jobs_pipeline_id_pipelines"), "jobs", type_="foreignkey")
    op.drop_index(op.f("ix_jobs_pipeline_id"), table_name="jobs")
    op.drop_column("jobs", "pipeline_version")
    op.drop_column("jobs", "pipeline_id")
    op.drop_table("pipeline_versions")
    op.drop_table("pipelines")
