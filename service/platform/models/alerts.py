"""Alerts' rows: an owner's rules, the outbox of what they matched, and the event log cursor."""

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    ForeignKey,
    Index,
    Integer,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from service.platform.models.base import Base


class AlertRuleRow(Base):
    """What an owner wants to hear about, and where: ``kind`` with its ``threshold`` (retries,
    seconds), optionally narrowed to one ``pipeline``, sent to ``url`` signed with the secret
    named ``secret`` (the deployment's webhook secret when none), as ``format``. ``source``
    ``settings`` marks a rule written from ``FLOWBEAT_ALERTS``, which only settings change."""

    __tablename__ = "alert_rules"
    __table_args__ = (UniqueConstraint("owner", "name"),)

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True, default=uuid.uuid4)
    owner: Mapped[str] = mapped_column(String(128))
    name: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(32))
    threshold: Mapped[int | None] = mapped_column(Integer)
    pipeline: Mapped[str | None] = mapped_column(String(200))
    url: Mapped[str] = mapped_column(Text)
    secret: Mapped[str | None] = mapped_column(String(128))
    format: Mapped[str] = mapped_column(String(16))
    dedupe_s: Mapped[int] = mapped_column(Integer)
    enabled: Mapped[bool] = mapped_column(Boolean)
    source: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())


class AlertDeliveryRow(Base):
    """The outbox: one row per (rule, event) a rule matched outside its dedupe window, written
    in the transaction that read the event, so a crash or a broker restart loses none and
    ``event_key`` lets none in twice. A row stays ``pending`` until delivered or given up;
    ``next_attempt_at`` is both its backoff and the lease of the worker sending it.
    ``suppressed`` counts the later events of its subject the window held back."""

    __tablename__ = "alert_deliveries"
    __table_args__ = (
        UniqueConstraint("rule_id", "event_key"),
        Index(None, "rule_id", "subject", "created_at"),
        Index(None, "rule_id", "id"),
        Index(
            "ix_alert_deliveries_due",
            "next_attempt_at",
            postgresql_where=text("status = 'pending'"),
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    rule_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("alert_rules.id", ondelete="CASCADE")
    )
    event_key: Mapped[str] = mapped_column(String(200))
    subject: Mapped[str] = mapped_column(String(300))
    payload: Mapped[dict[str, Any]]
    status: Mapped[str] = mapped_column(String(16), server_default=text("'pending'"))
    attempts: Mapped[int] = mapped_column(SmallInteger, server_default=text("0"))
    suppressed: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    next_attempt_at: Mapped[datetime] = mapped_column(server_default=func.now())
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    delivered_at: Mapped[datetime | None]

    @property
    def delivery_id(self) -> str:
        """Every attempt carries it as ``X-Flowbeat-Delivery``, so a receiver can drop a repeat."""
        return f"alert-{self.id}"


class AlertCursorRow(Base):
    """How far the matcher has read the event log (``service.alerts.matching`` says why the ids
    it has not seen yet, ``gaps``, are kept with the snapshot that missed them)."""

    __tablename__ = "alert_cursor"

    id: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    last_event_id: Mapped[int] = mapped_column(BigInteger)
    gaps: Mapped[list[list[int]]] = mapped_column(JSONB)
