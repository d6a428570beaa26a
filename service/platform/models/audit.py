"""The audit trail's row: one change made through the API, the CLI, MCP or the dashboard."""

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, CheckConstraint, Index, String, text
from sqlalchemy.orm import Mapped, mapped_column

from service.platform.models.base import Base

AUDIT_CHANNELS = ("api", "cli", "mcp", "ui")


class AuditEventRow(Base):
    """Written in the transaction of the change it records, so a refused change leaves none.

    ``actor`` is the acting key's prefix (api, mcp, ui) or the OS user (cli); ``owner`` is the
    owner it acted as. ``source`` is the route or the command."""

    __tablename__ = "audit_events"
    __table_args__ = (
        CheckConstraint(
            "channel IN (" + ", ".join(f"'{c}'" for c in AUDIT_CHANNELS) + ")", name="channel"
        ),
        Index(None, "at", "id"),
        Index(None, "target_kind", "target_id", "at"),
        Index(None, "actor", "at"),
        Index(None, "owner", "at"),
        Index(None, "action", "at"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(server_default=text("now()"))
    channel: Mapped[str] = mapped_column(String(8))
    source: Mapped[str] = mapped_column(String(128))
    actor: Mapped[str] = mapped_column(String(128))
    owner: Mapped[str] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(32))
    target_kind: Mapped[str] = mapped_column(String(16))
    target_id: Mapped[str] = mapped_column(String(256))
    detail: Mapped[dict[str, Any]] = mapped_column(server_default=text("'{}'::jsonb"))
