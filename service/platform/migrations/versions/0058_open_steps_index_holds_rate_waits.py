"""the open steps' index holds the steps that wait for a rate too

``ix_step_runs_status_lease_until`` holds open steps only (migration 0042), but
``awaiting_rate`` (migration 0046) came after it and was left out. The model names every
status that is not final, and so do its readers: the metrics' count of open steps by status
found no index that held all it asked for, and read every step row kept at each scrape.

Revision ID: 0058
Revises: 0057
"""

from alembic import op

revision = "0058"
down_revision = "0057"
branch_labels = None
depends_on = None

_BEFORE = (
    "'pending', 'running', 'retrying', 'awaiting_approval', 'awaiting_slot', 'sleeping', "
    "'awaiting_signal', 'awaiting_child'"
)
_OPEN = (
    "'pending', 'running', 'retrying', 'awaiting_approval', 'awaiting_slot', 'sleeping', "
    "'awaiting_signal', 'awaiting_rate', 'awaiting_child'"
)
"""Every status that is not final, in the order of ``StepStatus``, as the model has them."""


def _index(statuses: str) -> None:
    op.drop_index("ix_step_runs_status_lease_until", table_name="step_runs")
    op.create_index(
        "ix_step_runs_status_lease_until",
        "step_runs",
        ["status", "lease_until"],
        postgresql_where=f"status IN ({statuses})",
    )


def upgrade() -> None:
    _index(_OPEN)


def downgrade() -> None:
    _index(_BEFORE)
