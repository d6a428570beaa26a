"""datasets schema for data.upsert

Revision ID: 0005
Revises: 0001

The schema only: data refresh profiles upsert into tables the operator creates there, so a
profile can never create or alter tables itself.
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE SCHEMA IF NOT EXISTS datasets")


def downgrade() -> None:
    op.execute("DROP SCHEMA IF EXISTS datasets")
