"""the text each pipeline version was saved from

Revision ID: 0019
Revises: 0018
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("pipeline_versions", sa.Column("source", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("pipeline_versions", "source")
