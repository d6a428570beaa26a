"""an allowed status move queues no trigger event: the lifecycle table is asked in the
update trigger's condition

An ``AFTER UPDATE`` row trigger whose condition holds queues an event that PostgreSQL runs at
the statement's end: it fetches the old and new rows again and calls the function with them,
about 25 microseconds at each status change, eight a chain job. The allowed moves now live in
``flowbeat_move_allowed``, a plpgsql function of three texts that the trigger's condition
calls; ``flowbeat_check_status`` runs only for a move it refuses, and raises as before (ADR 23).
``service.platform.lifecycle`` writes the table into the new function at every migration to
head, as it wrote it into the old one; until then it allows every move, as 0020's did.

Revision ID: 0054
Revises: 0053
"""

from alembic import op

revision = "0054"
down_revision = "0053"
branch_labels = None
depends_on = None

TABLES = (("jobs", "job"), ("step_runs", "step"), ("compensations", "compensation"))

_ASK = """
CREATE FUNCTION flowbeat_move_allowed(entity text, old_status text, new_status text)
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN true;
END
$$;
CREATE OR REPLACE FUNCTION flowbeat_check_status() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    old_status text;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        old_status := OLD.status;
    END IF;
    IF flowbeat_move_allowed(TG_ARGV[0], old_status, NEW.status) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION USING
        MESSAGE = 'status move ' || TG_ARGV[0] || ':' || coalesce(old_status, '') || '>'
                  || NEW.status || ' is not in the lifecycle table',
        ERRCODE = 'check_violation';
END
$$;
"""
_ASKED = " AND NOT flowbeat_move_allowed('{entity}', OLD.status, NEW.status)"


def _trigger(table: str, entity: str, asked: str) -> None:
    op.execute(f"DROP TRIGGER {table}_lifecycle ON {table}")
    op.execute(
        f"""
        CREATE TRIGGER {table}_lifecycle AFTER UPDATE OF status ON {table}
           FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status{asked})
           EXECUTE FUNCTION flowbeat_check_status('{entity}')
        """
    )


def upgrade() -> None:
    op.execute(_ASK)
    for table, entity in TABLES:
        _trigger(table, entity, _ASKED.format(entity=entity))


def downgrade() -> None:
    for table, entity in TABLES:
        _trigger(table, entity, "")
    op.execute("DROP FUNCTION flowbeat_move_allowed(text, text, text)")
    op.execute(
        """
        CREATE OR REPLACE FUNCTION flowbeat_check_status() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RETURN NEW;
        END
        $$
        """
    )
