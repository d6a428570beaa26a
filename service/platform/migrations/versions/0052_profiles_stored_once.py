"""a profile is stored once, by its content hash, not in every job that runs it

``job_profiles`` holds each profile jobs ran, keyed by ``profile_hash``; ``jobs.profile`` goes.
A job's row carried its whole profile snapshot, which PostgreSQL does not compress below 2 kB:
about 700 of a chain job's 1,030 bytes, written into the WAL once a job (ADR 22).

Revision ID: 0052
Revises: 0051
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0052"
down_revision = "0051"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_profiles",
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.Column("profile", JSONB(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("hash", name=op.f("pk_job_profiles")),
    )
    op.execute(
        "INSERT INTO job_profiles (hash, profile)"
        " SELECT DISTINCT ON (profile_hash) profile_hash, profile FROM jobs"
    )
    op.drop_column("jobs", "profile")


def downgrade() -> None:
    op.add_column("jobs", sa.Column("profile", JSONB(), nullable=True))
    op.execute(
        "UPDATE jobs SET profile = p.profile"
        " FROM job_profiles AS p WHERE p.hash = jobs.profile_hash"
    )
    op.alter_column("jobs", "profile", nullable=False)
    op.drop_table("job_profiles")
