"""The calls of ``pipeline.run`` steps: which child job each attempt of a step started.

Kept apart from the step rows, which every step writes, so a step that starts no child pays
nothing for them; keyed by (job, step, attempt), so an attempt starts one child whatever
happens to its messages.
"""

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, ForeignKey, Index, Integer, String, text
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from service.platform.models.base import Base


class ChildCallRow(Base):
    """An attempt of a ``pipeline.run`` step: the pipeline and params its inputs resolved to,
    whether it waits, and once the beat leader started it, the child job (``NULL`` until then;
    a child pruned by retention leaves it ``NULL`` on a settled step)."""

    __tablename__ = "child_calls"
    __table_args__ = (
        Index(None, "child_job_id"),
        Index("ix_child_calls_unstarted", "created_at", postgresql_where=text("NOT started")),
    )

    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    step_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    pipeline: Mapped[str] = mapped_column(String(64))
    params: Mapped[Any] = mapped_column(JSONB)
    wait: Mapped[bool] = mapped_column(Boolean)
    started: Mapped[bool] = mapped_column(Boolean, default=False)
    child_job_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="SET NULL")
    )
    created_at: Mapped[datetime]
