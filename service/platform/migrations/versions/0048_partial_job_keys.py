"""a job's idempotency key and saved pipeline are indexed only where it has them

``uq_jobs_owner_idempotency_key`` becomes a unique index on jobs with a key, and
``ix_jobs_pipeline_id`` an index on jobs from a saved pipeline. No ``jobs`` update is HOT, so
every full index takes an entry at a job's insert and at each status change: a job sent
without a key, or from a shipped profile, wrote one to each of these for nothing (ADR 18). The
intake's ``ON CONFLICT`` names the unique index's predicate so that PostgreSQL still infers it.

Revision ID: 0048
Revises: 0047
"""

import sqlalchemy as sa
from alembic import op

revision = "0048"
down_revision = "0047"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "uq_jobs_owner_idempotency_key_some",
        "jobs",
        ["owner", "idempotency_key"],
        unique=True,
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
    )
    op.drop_constraint("uq_jobs_owner_idempotency_key", "jobs", type_="unique")
    op.execute(
        "ALTER INDEX uq_jobs_owner_idempotency_key_some RENAME TO uq_jobs_owner_idempotency_key"
    )
    op.drop_index("ix_jobs_pipeline_id", table_name="jobs")
    op.create_index(
        "ix_jobs_pipeline_id",
        "jobs",
        ["pipeline_id"],
        postgresql_where=sa.text("pipeline_id IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_pipeline_id", table_name="jobs")
    op.create_index("ix_jobs_pipeline_id", "jobs", ["pipeline_id"])
    op.drop_index("uq_jobs_owner_idempotency_key", table_name="jobs")
    op.create_unique_constraint(
        "uq_jobs_owner_idempotency_key", "jobs", ["owner", "idempotency_key"]
    )
