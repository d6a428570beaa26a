"""dependency triggers of a kind: on any success, or on a success with new result items

Revision ID: 0017
Revises: 0016
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "pipeline_triggers",
        sa.Column("kind", sa.String(length=16), server_default="succeeded", nullable=False),
    )


def downgrade() -> None:
    op.drop_column("pipeline_triggers", "kind")
