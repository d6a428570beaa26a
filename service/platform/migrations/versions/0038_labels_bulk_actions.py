"""labels on jobs (GIN-indexed), schedules and hooks; failed jobs by error code; bulk_actions

``labels`` is added with a constant default, which PostgreSQL 11 and later store in the
catalogue: no row of ``jobs`` is rewritten. The two indexes are built in the migration's
transaction (``CREATE INDEX``, not ``CONCURRENTLY``), so jobs are not written while they build.

Revision ID: 0038
Revises: 0036
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0038"
down_revision = "0037"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ("jobs", "schedules", "hooks"):
        op.add_column(
            table,
            sa.Column(
                "labels",
                postgresql.JSONB(astext_type=sa.Text()),
                server_default=sa.text("'{}'::jsonb"),
                nullable=False,
            ),
        )
    op.create_index(
        "ix_jobs_labels",
        "jobs",
        ["labels"],
        postgresql_using="gin",
        postgresql_ops={"labels": "jsonb_path_ops"},
    )
    op.create_index(
        "ix_jobs_error_code",
        "jobs",
        [sa.text("(error ->> 'code')"), "created_at"],
        postgresql_where=sa.text("error IS NOT NULL"),
    )
    op.create_table(
        "bulk_actions",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("scope", sa.String(length=128), nullable=True),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("filter", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("options", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("matched", sa.Integer(), nullable=False),
        sa.Column("acted", sa.Integer(), nullable=False),
        sa.Column("skipped", sa.Integer(), nullable=False),
        sa.Column("after_created_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("after_id", sa.UUID(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("kind IN ('cancel', 'rerun')", name=op.f("ck_bulk_actions_kind")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_bulk_actions")),
    )


def downgrade() -> None:
    op.drop_table("bulk_actions")
    op.drop_index("ix_jobs_error_code", "jobs")
    op.drop_index("ix_jobs_labels", "jobs")
    op.drop_column("jobs", "labels")
    op.drop_column("schedules", "labels")
    op.drop_column("hooks", "labels")
