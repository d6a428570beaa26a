"""the dependency queue is read in the order successes were queued, through an index

The beat leader drains the queue a batch at a time, oldest first, skipping rows another
replica holds: with no index on ``queued_at``, every drain sorted the whole queue, which grows
with the successes waiting while no leader drains it (a long leader outage, a burst of
upstream successes). A success queued then takes one index entry more.

Revision ID: 0060
Revises: 0059
"""

from alembic import op

revision = "0060"
down_revision = "0059"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_dependency_queue_queued_at", "dependency_queue", ["queued_at"])


def downgrade() -> None:
    op.drop_index("ix_dependency_queue_queued_at", table_name="dependency_queue")
