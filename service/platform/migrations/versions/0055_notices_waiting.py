"""a job's notice of new items that waits for an outcome is marked on its row

The sweeper looked for notices whose task was lost among every ``new_items`` event the log
held, each with a probe for its outcome: a scan that grew with the history, every ten
seconds. ``jobs.notice_due_at`` is set while a notice waits, and ``ix_jobs_notice_due_at``
holds those jobs only. The notices that wait now are marked from the log.

Revision ID: 0055
Revises: 0054
"""

import sqlalchemy as sa
from alembic import op

revision = "0055"
down_revision = "0054"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("notice_due_at", sa.DateTime(timezone=True), nullable=True))
    op.execute(
        """
        UPDATE jobs AS j SET notice_due_at = w.due
          FROM (SELECT e.job_id, max(e.created_at) AS due FROM job_events AS e
                 WHERE e.kind IN ('new_items', 'notice_resent')
                 GROUP BY e.job_id) AS w
         WHERE j.id = w.job_id AND j.notify_url IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM job_events AS o
                            WHERE o.job_id = j.id AND o.kind IN ('notified', 'notify_failed'))
        """
    )
    op.create_index(
        "ix_jobs_notice_due_at",
        "jobs",
        ["notice_due_at"],
        postgresql_where=sa.text("notice_due_at IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_notice_due_at", table_name="jobs")
    op.drop_column("jobs", "notice_due_at")
