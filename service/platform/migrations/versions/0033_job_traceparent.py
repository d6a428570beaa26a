"""a job's trace: the traceparent it was submitted in, for the messages sent outside its steps

The beat (timers, slots, children, deadlines), the sweeper and the routes that resume a job
(approvals, signals) send its steps from a context of their own; the job's messages carry the
trace it started in, so one job is one trace whoever sends them.

Revision ID: 0033
Revises: 0032
"""

import sqlalchemy as sa
from alembic import op

revision = "0033"
down_revision = "0032"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("traceparent", sa.String(55), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "traceparent")
