"""the event log's listeners, so that the step path notifies only while someone listens

``event_listeners`` holds the backend pid of each connection that listens on
``flowbeat_events``. The statements of the step path notify only while it has a row: a
notifying commit holds a lock for the whole database until its flush, so notifying commits
share no flush (ADR 19). Unlogged, since a crash ends the listeners' connections too, and they
register again as they reconnect.

Revision ID: 0049
Revises: 0048
"""

import sqlalchemy as sa
from alembic import op

revision = "0049"
down_revision = "0048"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "event_listeners",
        sa.Column("pid", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column(
            "since", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("pid", name=op.f("pk_event_listeners")),
        prefixes=["UNLOGGED"],
    )


def downgrade() -> None:
    op.drop_table("event_listeners")
