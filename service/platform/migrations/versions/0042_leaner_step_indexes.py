"""fewer index entries and no row lock on the job per step

- ``ix_step_runs_status_lease_until`` holds open steps only: the sweeper's lease and timeout
  scans and the metrics' count read open statuses, and a settled step (every step's last
  write) no longer adds an entry. A step's row is updated twice and no update of it can be
  HOT while its status is in an index, so each write it is spared is one entry fewer.
- ``ix_jobs_schedule_id`` holds scheduled jobs only: a job sent through the API (most of them)
  writes no entry there at its intake and at each of its status changes, none of which is HOT.
- ``step_checkpoints`` loses its foreign key to ``jobs``: its check ran a statement for every
  checkpoint and locked the job's row FOR KEY SHARE, a WAL record and, with the job's row
  locked by another transaction, a multixact. A checkpoint is only ever written by the
  statement that settles its step's row, whose own foreign key holds the job; the statement
  trigger that forgets a deleted job's events deletes its checkpoints too.

Revision ID: 0042
Revises: 0041
"""

from alembic import op

revision = "0042"
down_revision = "0041"
branch_labels = None
depends_on = None

OPEN_STEP = (
    "status IN ('pending', 'running', 'retrying', 'awaiting_approval', 'awaiting_slot', "
    "'sleeping', 'awaiting_signal', 'awaiting_child')"
)

_FORGET = """
CREATE OR REPLACE FUNCTION flowbeat_forget_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM job_events WHERE job_id IN (SELECT id FROM gone);
    DELETE FROM job_event_seqs WHERE job_id IN (SELECT id FROM gone);{checkpoints}
    RETURN NULL;
END $$;
"""
_CHECKPOINTS = "\n    DELETE FROM step_checkpoints WHERE job_id IN (SELECT id FROM gone);"


def upgrade() -> None:
    op.drop_index("ix_step_runs_status_lease_until", table_name="step_runs")
    op.create_index(
        "ix_step_runs_status_lease_until",
        "step_runs",
        ["status", "lease_until"],
        postgresql_where=OPEN_STEP,
    )
    op.drop_index("ix_jobs_schedule_id", table_name="jobs")
    op.create_index(
        "ix_jobs_schedule_id", "jobs", ["schedule_id"], postgresql_where="schedule_id IS NOT NULL"
    )
    op.drop_constraint("fk_step_checkpoints_job_id_jobs", "step_checkpoints", type_="foreignkey")
    op.execute(_FORGET.format(checkpoints=_CHECKPOINTS))


def downgrade() -> None:
    op.execute(_FORGET.format(checkpoints=""))
    op.execute("DELETE FROM step_checkpoints WHERE job_id NOT IN (SELECT id FROM jobs)")
    op.create_foreign_key(
        "fk_step_checkpoints_job_id_jobs",
        "step_checkpoints",
        "jobs",
        ["job_id"],
        ["id"],
        ondelete="CASCADE",
    )
    op.drop_index("ix_jobs_schedule_id", table_name="jobs")
    op.create_index("ix_jobs_schedule_id", "jobs", ["schedule_id"])
    op.drop_index("ix_step_runs_status_lease_until", table_name="step_runs")
    op.create_index("ix_step_runs_status_lease_until", "step_runs", ["status", "lease_until"])
