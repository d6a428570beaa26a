"""The step cache's rows: the outputs a cache-declaring step may reuse, and where a cached
step took its own from (ADR 17)."""

import uuid
from datetime import datetime

from sqlalchemy import Index, Integer, String, text
from sqlalchemy.dialects.postgresql import UUID
from sqlalchemy.orm import Mapped, mapped_column

from service.platform.models.base import Base


class StepCacheRow(Base):
    """A step of a cache-declaring profile that settled with an output: an entry when it ran
    its action (``source_job_id`` null), a use when it took an entry's output instead.

    Entries are found by owner and key, newest first, through ``ix_step_cache_lookup``, which
    uses leave out; the output itself stays in the entry's checkpoint. Written by the step's
    checkpoint statement, so, like a checkpoint, it has no foreign key to ``jobs`` (whose check
    would lock the job's row): the trigger that forgets a deleted job's rows deletes these too.
    """

    __tablename__ = "step_cache"
    __table_args__ = (
        Index(
            "ix_step_cache_lookup",
            "owner",
            "cache_key",
            text("created_at DESC"),
            postgresql_where=text("source_job_id IS NULL"),
        ),
    )

    job_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    step_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    shard: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner: Mapped[str] = mapped_column(String(128))
    cache_key: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime]
    source_job_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    source_step_id: Mapped[str | None] = mapped_column(String(64))
    source_shard: Mapped[int | None] = mapped_column(Integer)
