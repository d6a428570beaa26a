"""A bulk action's row: the filter it acts on, frozen when it starts, and how far it got, so a
retry of the same action (after a timeout or an API restart) continues where it stopped."""

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import CheckConstraint, Integer, String, func
from sqlalchemy.dialects.postgresql import UUID
from sqlalchemy.orm import Mapped, mapped_column

from service.platform.models.base import Base

BULK_KINDS = ("cancel", "rerun")


class BulkActionRow(Base):
    """``scope`` is the owner whose jobs it may touch, ``None`` for an admin's (every owner);
    ``after_created_at``/``after_id`` the last job it went past, in (created_at, id) order."""

    __tablename__ = "bulk_actions"
    __table_args__ = (
        CheckConstraint(
            "kind IN (" + ", ".join(f"'{kind}'" for kind in BULK_KINDS) + ")", name="kind"
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    scope: Mapped[str | None] = mapped_column(String(128))
    actor: Mapped[str] = mapped_column(String(128))
    filter: Mapped[dict[str, Any]]
    options: Mapped[dict[str, Any]]
    status: Mapped[str] = mapped_column(String(16))
    matched: Mapped[int] = mapped_column(Integer)
    acted: Mapped[int] = mapped_column(Integer, default=0)
    skipped: Mapped[int] = mapped_column(Integer, default=0)
    after_created_at: Mapped[datetime | None]
    after_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    updated_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]
