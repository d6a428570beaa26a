"""the lifecycle check runs after the row is written, so that a status change locks nothing

A ``BEFORE UPDATE`` row trigger makes PostgreSQL lock the row it is about to update first
(``GetTupleForTrigger``), which writes a WAL record of its own: 54 bytes at each status change,
152 bytes a chain step. An ``AFTER UPDATE`` row trigger reads the old and new rows the update
made and raises the same error, which undoes the statement as before (ADR 21). The insert
trigger locks nothing and stays as it is.

Revision ID: 0051
Revises: 0050
"""

from alembic import op

revision = "0051"
down_revision = "0050"
branch_labels = None
depends_on = None

TABLES = (("jobs", "job"), ("step_runs", "step"), ("compensations", "compensation"))


def _trigger(table: str, entity: str, timing: str) -> None:
    op.execute(f"DROP TRIGGER {table}_lifecycle ON {table}")
    op.execute(
        f"""
        CREATE TRIGGER {table}_lifecycle {timing} UPDATE OF status ON {table}
           FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
           EXECUTE FUNCTION flowbeat_check_status('{entity}')
        """
    )


def upgrade() -> None:
    for table, entity in TABLES:
        _trigger(table, entity, "AFTER")


def downgrade() -> None:
    for table, entity in TABLES:
        _trigger(table, entity, "BEFORE")
