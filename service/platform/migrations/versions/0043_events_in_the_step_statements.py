"""the step path's statements log their own changes; no foreign key from steps to jobs; the
label index holds labelled jobs only

- ``jobs`` and ``step_runs`` get ``logged_inline``, which a statement that appends the events
  of its changes itself flips (the claim and checkpoint statements,
  ``service.engine.inline_events``); the log's triggers on those tables, and the dependency
  trigger, skip a change whose mark moved. A job stored by a statement that logs its first
  event itself is stored with the mark set, and ``jobs_created_event`` skips it. Every other
  change is logged as before.
- ``step_runs`` loses its foreign key to ``jobs``: its check ran a statement and wrote a row
  lock on the job's row for each step row inserted. The intake inserts a job's steps in the
  statement that inserts the job; the statement trigger that forgets a deleted job's events
  and checkpoints deletes its steps too.
- ``ix_jobs_labels`` holds only jobs with labels: a GIN index writes an entry for an empty
  document too, at every write of a job's row.
- ``step_runs``' primary key is the step's own (job, step, shard), which was already unique,
  instead of its number: no update of a step row can be HOT, so every index of the table takes
  an entry at the insert and at each of a step's two updates. ``id`` stays, unindexed, for the
  order a job's steps were inserted in.
- ``step_runs`` and ``jobs`` leave room on each page for their rows' updates (fillfactor): a
  row is updated twice or more after its insert, and an update whose new version does not fit
  on the old one's page writes a row lock to the WAL before it moves on to another page.

Revision ID: 0043
Revises: 0042
"""

import sqlalchemy as sa
from alembic import op

revision = "0043"
down_revision = "0042"
branch_labels = None
depends_on = None

_FILL = {"step_runs": 70, "jobs": 80}
_DEFERRED = "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW"
_UNMARKED = " AND OLD.logged_inline = NEW.logged_inline"


def _triggers(unmarked: str, stored: str) -> str:
    return f"""
DROP TRIGGER jobs_created_event ON jobs;
CREATE CONSTRAINT TRIGGER jobs_created_event AFTER INSERT ON jobs {_DEFERRED}{stored}
    EXECUTE FUNCTION flowbeat_job_event();
DROP TRIGGER jobs_status_event ON jobs;
CREATE CONSTRAINT TRIGGER jobs_status_event AFTER UPDATE OF status ON jobs {_DEFERRED}
    WHEN (OLD.status IS DISTINCT FROM NEW.status{unmarked})
    EXECUTE FUNCTION flowbeat_job_event();
DROP TRIGGER step_runs_status_event ON step_runs;
CREATE CONSTRAINT TRIGGER step_runs_status_event AFTER UPDATE OF status, attempts ON step_runs
    {_DEFERRED}
    WHEN (NEW.shard < 0 AND (OLD.status IS DISTINCT FROM NEW.status
                             OR OLD.attempts IS DISTINCT FROM NEW.attempts){unmarked})
    EXECUTE FUNCTION flowbeat_step_event();
DROP TRIGGER jobs_queue_dependents ON jobs;
CREATE TRIGGER jobs_queue_dependents AFTER UPDATE OF status ON jobs FOR EACH ROW
    WHEN (NEW.status = 'succeeded' AND OLD.status IS DISTINCT FROM NEW.status{unmarked})
    EXECUTE FUNCTION flowbeat_queue_dependents();
"""


_FORGET = """
CREATE OR REPLACE FUNCTION flowbeat_forget_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM job_events WHERE job_id IN (SELECT id FROM gone);
    DELETE FROM job_event_seqs WHERE job_id IN (SELECT id FROM gone);
    DELETE FROM step_checkpoints WHERE job_id IN (SELECT id FROM gone);{steps}
    RETURN NULL;
END $$;
"""
_STEPS = "\n    DELETE FROM step_runs WHERE job_id IN (SELECT id FROM gone);"


def _label_index(where: str | None) -> None:
    op.drop_index("ix_jobs_labels", table_name="jobs")
    op.create_index(
        "ix_jobs_labels",
        "jobs",
        ["labels"],
        postgresql_using="gin",
        postgresql_ops={"labels": "jsonb_path_ops"},
        postgresql_where=where,
    )


def upgrade() -> None:
    for table in ("jobs", "step_runs"):
        op.add_column(
            table,
            sa.Column("logged_inline", sa.Boolean(), server_default=sa.false(), nullable=False),
        )
    op.execute(_triggers(_UNMARKED, "\n    WHEN (NOT NEW.logged_inline)"))
    op.drop_constraint("fk_step_runs_job_id_jobs", "step_runs", type_="foreignkey")
    op.execute(_FORGET.format(steps=_STEPS))
    _label_index("labels <> '{}'::jsonb")
    for table, fill in _FILL.items():
        op.execute(f"ALTER TABLE {table} SET (fillfactor = {fill})")
    op.drop_constraint("pk_step_runs", "step_runs", type_="primary")
    op.drop_constraint("uq_step_runs_job_id_step_id_shard", "step_runs", type_="unique")
    op.create_primary_key("pk_step_runs", "step_runs", ["job_id", "step_id", "shard"])


def downgrade() -> None:
    op.drop_constraint("pk_step_runs", "step_runs", type_="primary")
    op.create_primary_key("pk_step_runs", "step_runs", ["id"])
    op.create_unique_constraint(
        "uq_step_runs_job_id_step_id_shard", "step_runs", ["job_id", "step_id", "shard"]
    )
    for table in _FILL:
        op.execute(f"ALTER TABLE {table} RESET (fillfactor)")
    _label_index(None)
    op.execute(_FORGET.format(steps=""))
    op.execute("DELETE FROM step_runs WHERE job_id NOT IN (SELECT id FROM jobs)")
    op.create_foreign_key(
        "fk_step_runs_job_id_jobs", "step_runs", "jobs", ["job_id"], ["id"], ondelete="CASCADE"
    )
    op.execute(_triggers("", ""))
    for table in ("step_runs", "jobs"):
        op.drop_column(table, "logged_inline")
