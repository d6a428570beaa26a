"""Every client flowbeat opens on the broker's Redis, plain (``redis://``) or found through
Redis Sentinel (``sentinel://``), made in one place.

Besides Celery's messages, the broker's Redis holds the beat leader lock, worker liveness,
the sweeper's epoch marker, rate limits and the directly pushed step messages. Were any of
them to reach Redis its own way, a failover would move Celery to the new primary and leave
that one writing to the old one, or to nothing: a second beat leader, workers taken for dead.

The Sentinel URL is kombu's: ``sentinel://[user:password@]host:port[/db]`` for each sentinel,
separated by ``;``. kombu and Celery read the password and database of the first one only, and
switch to another sentinel's URL when one fails, so ``celery_url`` repeats them on each.
"""

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel

SENTINEL_SCHEME = "sentinel"
SENTINEL_DEFAULT_PORT = 26379
_SENTINEL_PREFIX = f"{SENTINEL_SCHEME}://"


def is_sentinel(url: str) -> bool:
    return url.startswith(_SENTINEL_PREFIX)


@dataclass(frozen=True)
class SentinelUrl:
    """What a ``sentinel://`` URL names: where the sentinels answer, and the database and
    credentials of the primary they point to."""

    sentinels: tuple[tuple[str, int], ...]
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)


def parse_sentinel_url(url: str) -> SentinelUrl:
    """Raises ``ValueError`` saying what is wrong: a database or credentials given on one
    sentinel's URL are the primary's, so two sentinels naming different ones is a mistake."""
    sentinels: list[tuple[str, int]] = []
    dbs: set[int] = set()
    logins: set[tuple[str | None, str | None]] = set()
    for part in (chunk.strip() for chunk in url.split(";")):
        if not part:
            continue
        parsed = urlsplit(part)
        if parsed.scheme != SENTINEL_SCHEME or not parsed.hostname:
            raise ValueError(f"expected sentinel://host:port for each sentinel, got {part!r}")
        try:
            sentinels.append((parsed.hostname, parsed.port or SENTINEL_DEFAULT_PORT))
        except ValueError as exc:
            raise ValueError(f"a sentinel's port is not a number in {part!r}") from exc
        path = parsed.path.strip("/")
        if path and not path.isdigit():
            raise ValueError(f"the database must be a number, got {path!r}")
        if path:
            dbs.add(int(path))
        if parsed.username or parsed.password:
            logins.add((_unquoted(parsed.username), _unquoted(parsed.password)))
    if not sentinels:
        raise ValueError("a sentinel:// URL names no sentinel")
    if len(dbs) > 1 or len(logins) > 1:
        raise ValueError("the sentinels' URLs name different databases or passwords")
    username, password = logins.pop() if logins else (None, None)
    return SentinelUrl(tuple(sentinels), dbs.pop() if dbs else 0, username, password)


def _unquoted(text: str | None) -> str | None:
    return unquote(text) if text else None


@dataclass(frozen=True)
class BrokerAddress:
    """The broker as ``FLOWBEAT_BROKER_URL`` and, for Sentinel, the master's name and the
    sentinels' own password give it."""

    url: str
    master: str | None = None
    sentinel_password: str | None = field(default=None, repr=False)

    def __hash__(self) -> int:
        """The URL's hash, which Python keeps: a cached client is looked up on every step."""
        return hash(self.url)

    @property
    def sentinel(self) -> SentinelUrl | None:
        return parse_sentinel_url(self.url) if is_sentinel(self.url) else None

    def celery_url(self) -> str:
        """The URL for kombu and Celery: a Sentinel URL with the primary's credentials and
        database on every sentinel's part, since they read them from whichever part they use."""
        found = self.sentinel
        if found is None:
            return self.url
        login = ""
        if found.username or found.password:
            user, password = (
                quote(part or "", safe="") for part in (found.username, found.password)
            )
            login = f"{user}:{password}@"
        return ";".join(
            f"{_SENTINEL_PREFIX}{login}{host}:{port}/{found.db}" for host, port in found.sentinels
        )

    def transport_options(self, timeout_s: float) -> dict[str, Any]:
        """What kombu's Sentinel transport and Celery's Sentinel backend need beside the URL;
        nothing for plain Redis. The sentinels get the timeouts too: without them kombu and
        Celery ask a sentinel that vanished without closing its socket forever."""
        if self.sentinel is None:
            return {}
        return {"master_name": self.master, "sentinel_kwargs": self.sentinel_kwargs(timeout_s)}

    def sentinel_kwargs(self, timeout_s: float | None) -> dict[str, Any]:
        """For the connections to the sentinels, which take their own password, not the
        primary's."""
        given: dict[str, Any] = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
        if self.sentinel_password is not None:
            given["password"] = self.sentinel_password
        return given


def _as_address(target: "BrokerAddress | str") -> BrokerAddress:
    return target if isinstance(target, BrokerAddress) else BrokerAddress(target)


@dataclass(frozen=True)
class _SentinelPlan:
    master: str
    sentinels: tuple[tuple[str, int], ...]
    sentinel_kwargs: dict[str, Any]
    primary: dict[str, Any]
    """``redis.Redis``'s arguments for the primary's connections."""


def _sentinel_plan(address: BrokerAddress, kwargs: dict[str, Any]) -> _SentinelPlan | None:
    found = address.sentinel
    if found is None:
        return None
    if not address.master:
        raise ValueError("a sentinel:// broker needs FLOWBEAT_BROKER_SENTINEL_MASTER")
    timeout = kwargs.get("socket_connect_timeout") or kwargs.get("socket_timeout")
    primary = {"db": found.db, "username": found.username, "password": found.password}
    return _SentinelPlan(
        address.master, found.sentinels, address.sentinel_kwargs(timeout), {**primary, **kwargs}
    )


class _SentinelRedis(redis.Redis):
    """Closing it also closes its connections to the sentinels, which redis-py leaves open."""

    def close(self) -> None:
        super().close()
        pool: Any = self.connection_pool
        pool.sentinel_manager.close()


class _AsyncSentinelRedis(redis.asyncio.Redis):
    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        pool: Any = self.connection_pool
        await pool.sentinel_manager.aclose()


def redis_client(target: BrokerAddress | str, **kwargs: Any) -> redis.Redis:
    """A client of the broker's Redis, or of the primary the sentinels name now: a connection
    lost in a failover is opened again to whichever primary they name then. ``kwargs`` are
    ``redis.Redis``'s."""
    address = _as_address(target)
    plan = _sentinel_plan(address, kwargs)
    if plan is None:
        return redis.Redis.from_url(address.url, **kwargs)
    manager: Any = redis.sentinel.Sentinel(plan.sentinels, sentinel_kwargs=plan.sentinel_kwargs)  # type: ignore[no-untyped-call]
    client: redis.Redis = manager.master_for(plan.master, _SentinelRedis, **plan.primary)
    return client


def async_redis_client(target: BrokerAddress | str, **kwargs: Any) -> redis.asyncio.Redis:
    """``redis_client`` for one event loop."""
    address = _as_address(target)
    plan = _sentinel_plan(address, kwargs)
    if plan is None:
        return redis.asyncio.Redis.from_url(address.url, **kwargs)
    manager: Any = redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call]
        plan.sentinels, sentinel_kwargs=plan.sentinel_kwargs
    )
    client: redis.asyncio.Redis = manager.master_for(
        plan.master, _AsyncSentinelRedis, **plan.primary
    )
    return client
