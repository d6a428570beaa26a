"""the rows that name a job by a nullable foreign key are indexed by it

``schedule_fires``, ``hook_deliveries`` and ``dependency_fires`` name the job they started,
and their foreign keys set it to null when the job is deleted. PostgreSQL finds those rows by
``job_id``, which no index held: retention's every pruned job read the three tables whole. Each
index holds the rows that name a job only.

Revision ID: 0057
Revises: 0056
"""

from alembic import op

revision = "0057"
down_revision = "0056"
branch_labels = None
depends_on = None

_TABLES = ("schedule_fires", "hook_deliveries", "dependency_fires")


def upgrade() -> None:
    for table in _TABLES:
        op.create_index(
            f"ix_{table}_job_id", table, ["job_id"], postgresql_where="job_id IS NOT NULL"
        )


def downgrade() -> None:
    for table in _TABLES:
        op.drop_index(f"ix_{table}_job_id", table_name=table)
