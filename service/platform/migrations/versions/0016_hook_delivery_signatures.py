"""hook deliveries keep their signature's digest, unique per hook, so one signed message never
makes two jobs

Revision ID: 0016
Revises: 0015

Deliveries accepted before this revision were signed without their delivery id and keep a null
digest; they are pruned within ``HOOK_DELIVERIES_KEPT_S`` like any other.
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("hook_deliveries", sa.Column("signature", sa.String(length=64), nullable=True))
    op.create_index(
        op.f("ix_hook_deliveries_hook_id_signature"),
        "hook_deliveries",
        ["hook_id", "signature"],
        unique=True,
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_hook_deliveries_hook_id_signature"), table_name="hook_deliveries")
    op.drop_column("hook_deliveries", "signature")
