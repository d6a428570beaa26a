"""API keys: ``fb_<prefix>_<secret>``, stored as the prefix and a SHA-256 of the secret.

The secret is 32 random bytes, so a fast hash is enough: there is nothing to brute-force that a
slow hash would protect. The prefix finds the row; the hash comparison is constant-time.
"""

import hashlib
import hmac
import secrets
import string
import threading
import time
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.platform.constants import API_KEY_PREFIX
from service.platform.errors import Forbidden, Unauthorized
from service.platform.models import ApiKeyRow

SCOPES = frozenset({"read", "write", "admin"})
PREFIX_LENGTH = 8
SECRET_BYTES = 32

_IMPLIED: dict[str, frozenset[str]] = {
    "admin": frozenset({"admin", "write", "read"}),
    "write": frozenset({"write", "read"}),
    "read": frozenset({"read"}),
}
_PREFIX_ALPHABET = string.ascii_letters + string.digits
_BAD_KEY = "missing or invalid API key"


@dataclass(frozen=True)
class Principal:
    owner: str
    scopes: frozenset[str]
    key_id: uuid.UUID
    prefix: str = ""
    """The key's public prefix, which the audit trail names it by."""

    @property
    def granted(self) -> frozenset[str]:
        """Scopes held directly or implied: admin implies write, write implies read."""
        return frozenset().union(*(_IMPLIED.get(scope, frozenset()) for scope in self.scopes))

    def has(self, scope: str) -> bool:
        return scope in self.granted

    def require(self, scope: str) -> None:
        if scope not in SCOPES:
            raise ValueError(f"unknown scope {scope!r}")
        if not self.has(scope):
            raise Forbidden(f"this API key lacks the {scope!r} scope", {"required": scope})


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _new_prefix() -> str:
    """Letters and digits only, so the ``_`` separators of a key stay unambiguous."""
    return "".join(secrets.choice(_PREFIX_ALPHABET) for _ in range(PREFIX_LENGTH))


def create_api_key(
    session: Session, *, owner: str, scopes: Collection[str]
) -> tuple[str, ApiKeyRow]:
    """Store a new key and return its full text, which is shown once and never stored."""
    if isinstance(scopes, str):
        raise ValueError("scopes must be a collection of scope names, not one string")
    wanted = set(scopes)
    if not wanted or not wanted <= SCOPES:
        raise ValueError(f"scopes must be a non-empty subset of {sorted(SCOPES)}, got {scopes!r}")
    if not owner:
        raise ValueError("owner must not be empty")
    prefix = _new_prefix()
    secret = secrets.token_urlsafe(SECRET_BYTES)
    row = ApiKeyRow(
        id=uuid.uuid4(),
        owner=owner,
        prefix=prefix,
        secret_hash=hash_secret(secret),
        scopes=sorted(wanted),
    )
    session.add(row)
    session.flush()
    return f"{API_KEY_PREFIX}{prefix}_{secret}", row


def _split(token: str) -> tuple[str, str] | None:
    if not token.startswith(API_KEY_PREFIX):
        return None
    prefix, sep, secret = token[len(API_KEY_PREFIX) :].partition("_")
    if not sep or len(prefix) != PREFIX_LENGTH or not secret:
        return None
    return prefix, secret


def authenticate(session: Session, token: str) -> Principal:
    """The principal of a key. Every failure reads the same, so callers learn nothing about
    which keys exist or were revoked."""
    parts = _split(token)
    if parts is None:
        raise Unauthorized(_BAD_KEY)
    prefix, secret = parts
    row = session.scalars(select(ApiKeyRow).where(ApiKeyRow.prefix == prefix)).one_or_none()
    expected = row.secret_hash if row is not None else hash_secret("")
    matches = hmac.compare_digest(expected, hash_secret(secret))
    if row is None or not matches or row.revoked_at is not None:
        raise Unauthorized(_BAD_KEY)
    return Principal(
        owner=row.owner, scopes=frozenset(row.scopes), key_id=row.id, prefix=row.prefix
    )


def revoke_api_key(session: Session, prefix: str, *, now: datetime | None = None) -> bool:
    """Revoke the key with this prefix. Returns whether a live key was revoked."""
    if prefix.startswith(API_KEY_PREFIX):
        prefix = prefix[len(API_KEY_PREFIX) :].partition("_")[0]
    row = session.scalars(select(ApiKeyRow).where(ApiKeyRow.prefix == prefix)).one_or_none()
    if row is None or row.revoked_at is not None:
        return False
    row.revoked_at = now or datetime.now(UTC)
    session.flush()
    return True


def list_api_keys(
    session: Session, *, owner: str | None = None, include_revoked: bool = False
) -> list[ApiKeyRow]:
    """Oldest first, so a listing reads in the order keys were handed out."""
    query = select(ApiKeyRow).order_by(ApiKeyRow.created_at, ApiKeyRow.prefix)
    if owner is not None:
        query = query.where(ApiKeyRow.owner == owner)
    if not include_revoked:
        query = query.where(ApiKeyRow.revoked_at.is_(None))
    return list(session.scalars(query))


class KeyCache:
    """Remembers keys that authenticated for ``ttl_s``, so a busy client costs no query per call.

    A revoked key stops working within ``ttl_s``. Entries are keyed by a hash of the key, and
    the key itself is never kept.
    """

    def __init__(self, ttl_s: float, max_entries: int = 10_000) -> None:
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._entries: dict[str, tuple[Principal, float]] = {}
        self._lock = threading.Lock()

    def cached(self, token: str) -> Principal | None:
        """The principal of a key that authenticated less than ``ttl_s`` ago; no I/O."""
        if self._ttl_s <= 0:
            return None
        with self._lock:
            hit = self._entries.get(hash_secret(token))
        return hit[0] if hit is not None and hit[1] > time.monotonic() else None

    def authenticate(self, session: Session, token: str) -> Principal:
        hit = self.cached(token)
        if hit is not None:
            return hit
        principal = authenticate(session, token)
        if self._ttl_s > 0:
            with self._lock:
                if len(self._entries) >= self._max_entries:
                    self._entries.clear()
                self._entries[hash_secret(token)] = (principal, time.monotonic() + self._ttl_s)
        return principal
