"""a trigger on every status column that refuses what the lifecycle table does not allow

Revision ID: 0020
Revises: 0019
"""

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

TABLES = (
    ("jobs", "job", "queued"),
    ("step_runs", "step", "pending"),
    ("compensations", "compensation", "pending"),
)


def upgrade() -> None:
    op.execute(
        """
        CREATE FUNCTION flowbeat_check_status() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RETURN NEW;
        END
        $$
        """
    )
    for table, entity, initial in TABLES:
        op.execute(
            f"""
            CREATE TRIGGER {table}_lifecycle BEFORE UPDATE OF status ON {table}
               FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
               EXECUTE FUNCTION flowbeat_check_status('{entity}')
            """
        )
        op.execute(
            f"""
            CREATE TRIGGER {table}_lifecycle_insert BEFORE INSERT ON {table}
               FOR EACH ROW WHEN (NEW.status <> '{initial}')
               EXECUTE FUNCTION flowbeat_check_status('{entity}')
            """
        )


def downgrade() -> None:
    for table, _entity, _initial in TABLES:
        op.execute(f"DROP TRIGGER {table}_lifecycle_insert ON {table}")
        op.execute(f"DROP TRIGGER {table}_lifecycle ON {table}")
    op.execute("DROP FUNCTION flowbeat_check_status()")
