"""Webhook triggers: a signed delivery to ``POST /v1/hooks/{name}`` starts a job.

A delivery is signed as flowbeat signs its own notices (``service.catalogue.notices.sign``), in the
Standard Webhooks manner: HMAC-SHA256 over ``<delivery id>.<timestamp>.<raw body>`` with the
hook's secret, compared in constant time, the timestamp within ``HOOK_TOLERANCE_S`` of now, so a
captured delivery can neither be sent again later nor under another delivery id. Within that
window two fences hold, both stored with the job in one transaction: the delivery id (a sender's
retry gets the first job back) and the signature's digest (one signed message never makes two
jobs, whatever it claims to be). Every refusal happens before anything is written.
"""

import hmac
import json
import re
import secrets
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from service.catalogue.notices import sign
from service.engine.submission import (
    JobRequest,
    Outcome,
    check_open_jobs,
    resolve_request,
    submit_job,
)
from service.language.expressions import HOOK_ROOTS, ExprContext, parse_refs, resolve
from service.platform.constants import HOOK_DELIVERIES_KEPT_S, HOOK_TOLERANCE_S, TRIGGER_WEBHOOK
from service.platform.errors import (
    ExpressionError,
    HookDeliverySeen,
    HookInvalid,
    HookNotFound,
    HookPayloadInvalid,
    HookSignatureInvalid,
    HookTimestampStale,
)
from service.platform.models import HookDeliveryRow, HookRow, JobRow

SECRET_PREFIX = "whsec_"
MIN_SECRET_CHARS = 24
DELIVERY_ID_PATTERN = r"[A-Za-z0-9_:-]{1,128}"
"""No dot: the signed content splits at its first two dots into one id, one timestamp."""
TIMESTAMP_PATTERN = r"[0-9]{1,12}"


@dataclass(frozen=True)
class HookSpec:
    pipeline: str
    params: Mapping[str, Any]
    secret: str | None = None
    enabled: bool = True
    labels: Mapping[str, str] = field(default_factory=dict)
    """Labels of the jobs it starts, over the profile's; values may read the job's params."""


@dataclass(frozen=True)
class Saved:
    hook: HookRow
    created: bool
    secret: str | None
    """The secret, when this save set it (generated or given); never shown again."""


def _check_mapping(params: Mapping[str, Any]) -> None:
    try:
        parse_refs(dict(params), HOOK_ROOTS)
    except ExpressionError as exc:
        raise HookInvalid(exc.message, {"field": "params", **exc.details}) from None


def put_hook(
    session: Session,
    name: str,
    spec: HookSpec,
    *,
    owner: str,
    profiles_dir: Path | None,
    known_actions: Collection[str],
) -> Saved:
    """Create or replace hook ``name``, run as ``owner``. A replace keeps the secret unless the
    spec gives one; a new hook gets a generated one unless given."""
    _check_mapping(spec.params)
    if spec.secret is not None and len(spec.secret) < MIN_SECRET_CHARS:
        raise HookInvalid(
            f"a hook secret needs at least {MIN_SECRET_CHARS} characters", {"field": "secret"}
        )
    resolved = resolve_request(
        session, spec.pipeline, owner=owner, profiles_dir=profiles_dir, known_actions=known_actions
    )
    unknown = sorted(set(spec.params) - set(resolved.profile.params))
    if unknown:
        raise HookInvalid(
            f"pipeline {spec.pipeline!r} has no param {unknown[0]!r}",
            {"field": "params", "unknown": unknown},
        )
    hook = session.scalar(select(HookRow).where(HookRow.name == name).with_for_update())
    created = hook is None
    secret = spec.secret or (SECRET_PREFIX + secrets.token_urlsafe(32) if created else None)
    if hook is None:
        assert secret is not None
        hook = HookRow(name=name, owner=owner, secret=secret)
        session.add(hook)
    elif secret is not None:
        hook.secret = secret
    hook.owner = owner
    hook.pipeline = spec.pipeline
    hook.params = dict(spec.params)
    hook.labels = dict(spec.labels)
    hook.enabled = spec.enabled
    session.flush()
    return Saved(hook, created, secret)


def get_hook(session: Session, name: str) -> HookRow:
    hook = session.scalar(select(HookRow).where(HookRow.name == name))
    if hook is None:
        raise HookNotFound(f"no hook {name!r}", {"hook": name})
    return hook


def list_hooks(session: Session) -> list[HookRow]:
    return list(session.scalars(select(HookRow).order_by(HookRow.name)))


def delete_hook(session: Session, name: str) -> None:
    session.delete(get_hook(session, name))
    session.flush()


@dataclass(frozen=True)
class Verified:
    delivery_id: str
    digest: str
    """The signature's hex digest: the fence for one signed message."""


def verify_signature(
    secret: str, headers: Mapping[str, str | None], body: bytes, now: datetime
) -> Verified:
    """Check a delivery's signature and age."""
    timestamp = headers.get("timestamp")
    signature = headers.get("signature")
    delivery = headers.get("delivery")
    if not timestamp or not signature or not delivery:
        raise HookSignatureInvalid(
            "a delivery needs X-Flowbeat-Timestamp, X-Flowbeat-Signature and X-Flowbeat-Delivery",
            {},
        )
    if not re.fullmatch(DELIVERY_ID_PATTERN, delivery):
        raise HookSignatureInvalid(
            "X-Flowbeat-Delivery is 1 to 128 letters, digits, '_', ':' or '-'", {}
        )
    if not re.fullmatch(TIMESTAMP_PATTERN, timestamp):
        raise HookSignatureInvalid("X-Flowbeat-Timestamp is not a Unix time", {})
    expected = sign(secret.encode(), delivery, timestamp, body)
    if not hmac.compare_digest(expected.encode(), signature.encode()):
        raise HookSignatureInvalid(
            "the signature does not match the delivery id, timestamp and body", {}
        )
    age = now.timestamp() - int(timestamp)
    if abs(age) > HOOK_TOLERANCE_S:
        raise HookTimestampStale(
            f"the delivery was signed {age:.0f} s from now; the tolerance is {HOOK_TOLERANCE_S} s",
            {"tolerance_s": HOOK_TOLERANCE_S},
        )
    return Verified(delivery, expected.removeprefix("sha256="))


@dataclass(frozen=True)
class Accepted:
    job: JobRow
    created: bool
    deduplicated: bool = False
    """The job is one the delivery duplicates (its pipeline's dedupe window), not its own."""


def accept_delivery(
    session: Session,
    name: str,
    headers: Mapping[str, str | None],
    body: bytes,
    *,
    now: datetime,
    profiles_dir: Path | None,
    known_actions: Collection[str],
    max_open_jobs: int = 0,
) -> Accepted:
    """Verify a delivery and store its job, or return the job its delivery id already made.

    A signed message already fenced under another delivery id, or whose job is gone, is
    ``HookDeliverySeen``. A new delivery counts against the hook owner's open jobs like a
    submit of theirs (``OpenJobsLimit``); a sender's retry of one accepted before does not."""
    hook = get_hook(session, name)
    verified = verify_signature(hook.secret, headers, body, now)
    delivery_id = verified.delivery_id
    if not hook.enabled:
        raise HookNotFound(f"hook {name!r} is disabled", {"hook": name})
    seen = _delivered(session, hook.id, delivery_id)
    if seen is not None:
        return Accepted(seen, False)
    params = _params(hook, body)
    check_open_jobs(session, hook.owner, max_open_jobs)
    inserted = session.execute(
        insert(HookDeliveryRow)
        .values(hook_id=hook.id, delivery_id=delivery_id, signature=verified.digest)
        .on_conflict_do_nothing()
        .returning(HookDeliveryRow.delivery_id)
    ).first()
    if inserted is None:
        seen = _delivered(session, hook.id, delivery_id)
        if seen is None:
            raise HookDeliverySeen(
                f"delivery {delivery_id!r} or its signed message was accepted before",
                {"hook": name, "delivery": delivery_id},
            )
        return Accepted(seen, False)
    job, outcome = submit_job(
        session,
        JobRequest(
            pipeline=hook.pipeline, params=params, trigger=TRIGGER_WEBHOOK, labels=hook.labels
        ),
        owner=hook.owner,
        profiles_dir=profiles_dir,
        known_actions=known_actions,
    )
    session.execute(
        update(HookDeliveryRow)
        .where(HookDeliveryRow.hook_id == hook.id, HookDeliveryRow.delivery_id == delivery_id)
        .values(job_id=job.id)
    )
    deduplicated = outcome is Outcome.DEDUPLICATED
    return Accepted(job, not deduplicated, deduplicated)


def _delivered(session: Session, hook_id: uuid.UUID, delivery_id: str) -> JobRow | None:
    return session.scalar(
        select(JobRow)
        .join(HookDeliveryRow, HookDeliveryRow.job_id == JobRow.id)
        .where(HookDeliveryRow.hook_id == hook_id, HookDeliveryRow.delivery_id == delivery_id)
    )


def _params(hook: HookRow, body: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(body) if body else None
    except ValueError:
        raise HookPayloadInvalid("the delivery's body is not JSON", {"hook": hook.name}) from None
    try:
        params = resolve(
            hook.params, ExprContext(params={}, outputs={}, payload=payload), HOOK_ROOTS
        )
    except ExpressionError as exc:
        raise HookPayloadInvalid(
            f"the delivery does not fit the hook's mapping: {exc.message}",
            {"hook": hook.name, **exc.details},
        ) from None
    assert isinstance(params, dict)
    return params


def prune_deliveries(session: Session, now: datetime) -> int:
    """Delivery ids older than the signature tolerance fence nothing: a replay is stale."""
    gone = session.execute(
        delete(HookDeliveryRow)
        .where(HookDeliveryRow.received_at < now - timedelta(seconds=HOOK_DELIVERIES_KEPT_S))
        .returning(HookDeliveryRow.delivery_id)
    )
    return len(gone.all())
