"""Alert rules: an owner's, saved through the API, and the deployment's, from ``FLOWBEAT_ALERTS``.

A rule is checked whole before anything is stored: a threshold its kind needs, a URL the
egress policy lets out, a signing secret the owner has. A settings rule is written by the beat
leader and is read-only through the API, so the settings stay what an operator reads.
"""

from dataclasses import dataclass

import httpx
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from service.catalogue.notices import validate_notify_url
from service.platform.clock import utcnow
from service.platform.egress import EgressPolicy
from service.platform.errors import (
    AlertNotFound,
    AlertRuleInvalid,
    AlertRuleManaged,
    EgressRefused,
    NotifyUrlInvalid,
)
from service.platform.models import AlertDeliveryRow, AlertRuleRow
from service.platform.secrets import secrets_of
from service.platform.settings import AlertRuleBody, Settings

THRESHOLD_KINDS = frozenset({"step_retried", "schedule_silent", "queue_age"})
EVENT_KINDS = frozenset({"job_failed", "deadline_passed", "approval_escalated", "step_retried"})
SOURCE_API = "api"
SOURCE_SETTINGS = "settings"
EGRESS_KIND = "alert"
"""The name ``FLOWBEAT_EGRESS_ACTION_ALLOWED_HOSTS`` narrows alerts' hosts under."""


@dataclass(frozen=True)
class SavedRule:
    rule: AlertRuleRow
    created: bool


def check_rule(body: AlertRuleBody, owner: str, settings: Settings) -> None:
    needs = body.kind in THRESHOLD_KINDS
    if needs and body.threshold is None:
        raise AlertRuleInvalid(
            f"a {body.kind} rule needs a threshold", {"field": "threshold", "kind": body.kind}
        )
    if not needs and body.threshold is not None:
        raise AlertRuleInvalid(
            f"a {body.kind} rule takes no threshold", {"field": "threshold", "kind": body.kind}
        )
    if body.kind == "queue_age" and body.pipeline is not None:
        raise AlertRuleInvalid(
            "a queue_age rule watches queues, not a pipeline", {"field": "pipeline"}
        )
    try:
        validate_notify_url(body.url)
        EgressPolicy.from_settings(settings, EGRESS_KIND).check_url(httpx.URL(body.url))
    except (NotifyUrlInvalid, EgressRefused) as exc:
        raise AlertRuleInvalid(exc.message, {"field": "url", "refused": exc.code}) from None
    if body.secret is not None and secrets_of(settings).value(body.secret, owner) is None:
        raise AlertRuleInvalid(
            f"no secret {body.secret} is configured for this deployment or owner",
            {"field": "secret", "secret": body.secret},
        )
    if body.secret is None and settings.webhook_secret is None:
        raise AlertRuleInvalid(
            "name a secret to sign with: FLOWBEAT_WEBHOOK_SECRET is not set", {"field": "secret"}
        )


def _find(session: Session, name: str, owner: str, *, lock: bool = False) -> AlertRuleRow | None:
    query = select(AlertRuleRow).where(AlertRuleRow.owner == owner, AlertRuleRow.name == name)
    return session.scalar(query.with_for_update() if lock else query)


def _store(session: Session, name: str, owner: str, body: AlertRuleBody, source: str) -> SavedRule:
    rule = _find(session, name, owner, lock=True)
    created = rule is None
    if rule is None:
        rule = AlertRuleRow(owner=owner, name=name)
        session.add(rule)
    elif rule.source == SOURCE_SETTINGS and source != SOURCE_SETTINGS:
        raise AlertRuleManaged(
            f"alert {name!r} comes from FLOWBEAT_ALERTS; change it there", {"alert": name}
        )
    rule.kind = body.kind
    rule.threshold = body.threshold
    rule.pipeline = body.pipeline
    rule.url = body.url
    rule.secret = body.secret
    rule.format = body.format
    rule.dedupe_s = body.dedupe_s
    rule.enabled = body.enabled
    rule.source = source
    rule.updated_at = utcnow()
    session.flush()
    return SavedRule(rule, created)


def put_rule(
    session: Session, name: str, body: AlertRuleBody, *, owner: str, settings: Settings
) -> SavedRule:
    """Create or replace ``owner``'s rule ``name``; a replaced rule keeps its deliveries."""
    check_rule(body, owner, settings)
    return _store(session, name, owner, body, SOURCE_API)


def get_rule(session: Session, name: str, owner: str) -> AlertRuleRow:
    rule = _find(session, name, owner)
    if rule is None:
        raise AlertNotFound(f"no alert {name!r}", {"alert": name})
    return rule


def list_rules(session: Session, owner: str) -> list[AlertRuleRow]:
    return list(
        session.scalars(
            select(AlertRuleRow).where(AlertRuleRow.owner == owner).order_by(AlertRuleRow.name)
        )
    )


def delete_rule(session: Session, name: str, owner: str) -> None:
    """Its deliveries go with it, sent or not."""
    rule = get_rule(session, name, owner)
    if rule.source == SOURCE_SETTINGS:
        raise AlertRuleManaged(
            f"alert {name!r} comes from FLOWBEAT_ALERTS; remove it there", {"alert": name}
        )
    session.delete(rule)
    session.flush()


def sync_settings_rules(session: Session, settings: Settings) -> list[AlertRuleInvalid]:
    """Write ``FLOWBEAT_ALERTS`` into PostgreSQL and drop the settings rules it no longer has.
    A settings rule named as one saved through the API takes it over. A rule that cannot work
    is left out and returned, for the beat to log, rather than stop every other rule."""
    keep: set[tuple[str, str]] = set()
    refused: list[AlertRuleInvalid] = []
    for item in settings.alerts:
        try:
            check_rule(item, item.owner, settings)
        except AlertRuleInvalid as exc:
            refused.append(
                AlertRuleInvalid(f"FLOWBEAT_ALERTS {item.name!r}: {exc.message}", exc.details)
            )
            continue
        _store(session, item.name, item.owner, item, SOURCE_SETTINGS)
        keep.add((item.owner, item.name))
    stale = [
        rule.id
        for rule in session.scalars(
            select(AlertRuleRow).where(AlertRuleRow.source == SOURCE_SETTINGS)
        )
        if (rule.owner, rule.name) not in keep
    ]
    if stale:
        session.execute(delete(AlertRuleRow).where(AlertRuleRow.id.in_(stale)))
    session.flush()
    return refused


def deliveries_of(
    session: Session, rule: AlertRuleRow, *, limit: int, before: int | None = None
) -> list[AlertDeliveryRow]:
    """Newest first; ``before`` is the id of the last one a previous page ended with."""
    query = select(AlertDeliveryRow).where(AlertDeliveryRow.rule_id == rule.id)
    if before is not None:
        query = query.where(AlertDeliveryRow.id < before)
    return list(session.scalars(query.order_by(AlertDeliveryRow.id.desc()).limit(limit)))


def recent_deliveries(
    session: Session, *, owner: str | None, limit: int
) -> list[tuple[AlertDeliveryRow, str]]:
    """The newest alerts of the rules ``owner`` may see (every owner's for ``None``, an
    admin), each with its rule's name."""
    query = select(AlertDeliveryRow, AlertRuleRow.name).join(
        AlertRuleRow, AlertRuleRow.id == AlertDeliveryRow.rule_id
    )
    if owner is not None:
        query = query.where(AlertRuleRow.owner == owner)
    rows = session.execute(query.order_by(AlertDeliveryRow.id.desc()).limit(limit)).all()
    return [(row, name) for row, name in rows]
