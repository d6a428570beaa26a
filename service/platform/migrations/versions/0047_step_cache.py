"""the step cache: its entries and uses, a job's ``refresh``, and ``cached`` in the step log

- ``step_cache`` holds a row for each step of a cache-declaring profile that settled with an
  output: an entry (the step ran its action) or a use (it took an entry's output, and names
  the job, step and shard it came from). ``ix_step_cache_lookup`` finds an owner's newest
  entry of a key; uses are left out of it. The step's checkpoint statement writes its row,
  so, as for checkpoints (0042), no foreign key: ``flowbeat_forget_jobs`` deletes a deleted
  job's rows.
- ``jobs.refresh``: a submission that runs every cache-declaring step again.
- ``flowbeat_step_event`` counts a ``cached`` shard as done in a fan-out's progress. (A
  ``cached`` step's own event, with its source, is written by its checkpoint statement.)

Revision ID: 0047
Revises: 0046
"""

import importlib.util
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0047"
down_revision = "0046"
branch_labels = None
depends_on = None


def _revision(name: str) -> ModuleType:
    path = Path(__file__).with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"flowbeat_revision_{name[:4]}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _events() -> ModuleType:
    return _revision("0041_one_statement_events")


def _forget(also: str) -> str:
    """``flowbeat_forget_jobs`` as migration 0043 left it, deleting ``also`` besides."""
    steps = _revision("0043_events_in_the_step_statements")
    return str(steps._FORGET.format(steps=steps._STEPS + also))


_CACHE_ROWS = "\n    DELETE FROM step_cache WHERE job_id IN (SELECT id FROM gone);"


def _step_event() -> str:
    append = _events()._append("NEW.job_id", "kind", "NEW.step_id", "body")
    return f"""
CREATE OR REPLACE FUNCTION flowbeat_step_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    body jsonb;
    kind text := 'step.' || NEW.status;
    appended integer;
BEGIN
    IF NEW.shard >= 0 THEN
        SELECT jsonb_build_object(
                   'done', count(*) FILTER (
                       WHERE status IN ('succeeded', 'reused', 'skipped', 'cached')),
                   'failed', count(*) FILTER (WHERE status = 'failed'),
                   'total', count(*))
          INTO body
          FROM step_runs
         WHERE job_id = NEW.job_id AND step_id = NEW.step_id AND shard >= 0;
        kind := 'step.progress';
    ELSE
        body := jsonb_build_object('attempt', NEW.attempts, 'round', NEW.round);
        IF NEW.error IS NOT NULL AND NEW.status IN ('retrying', 'failed', 'rejected') THEN
            body := body || jsonb_build_object('error', NEW.error);
        END IF;
    END IF;
    {append}
    RETURN NULL;
END $$;
"""


def upgrade() -> None:
    op.create_table(
        "step_cache",
        sa.Column("job_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("step_id", sa.String(length=64), nullable=False),
        sa.Column("shard", sa.Integer(), nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=False),
        sa.Column("cache_key", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("source_job_id", postgresql.UUID(as_uuid=True), nullable=True),
        sa.Column("source_step_id", sa.String(length=64), nullable=True),
        sa.Column("source_shard", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("job_id", "step_id", "shard", name=op.f("pk_step_cache")),
    )
    op.create_index(
        "ix_step_cache_lookup",
        "step_cache",
        ["owner", "cache_key", sa.text("created_at DESC")],
        postgresql_where=sa.text("source_job_id IS NULL"),
    )
    op.add_column(
        "jobs", sa.Column("refresh", sa.Boolean(), server_default=sa.false(), nullable=False)
    )
    op.execute(_step_event())
    op.execute(_forget(_CACHE_ROWS))


def downgrade() -> None:
    op.execute(_forget(""))
    op.execute(_events()._FUNCTIONS)
    op.drop_column("jobs", "refresh")
    op.drop_index("ix_step_cache_lookup", table_name="step_cache")
    op.drop_table("step_cache")
