"""kombu's Redis transport, minus a client object built per publish.

kombu wraps its connection pool in a new ``redis.Redis`` for every message it sends, and
redis-py fills a table of some 170 response callbacks each time: about a fifth of the CPU of a
publish, paid by the API on every job and by workers on every step of a chain. One client per
pool is enough, since a ``redis.Redis`` is thread-safe and holds no connection of its own.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    _shared_client: Any = None
    _shared_for: Any = None

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
            return
        pool = self.pool
        if self._shared_for is not pool:
            shared = self._create_client()  # type: ignore[no-untyped-call]
            self._shared_client, self._shared_for = shared, pool
        yield self._shared_client


class Transport(kombu_redis.Transport):
    Channel = Channel


def transport_for(broker_url: str | None) -> str | None:
    """This transport for a plain ``redis://`` broker; ``None`` keeps kombu's choice."""
    if broker_url and broker_url.startswith("redis://"):
        return f"{__name__}:{Transport.__name__}"
    return None
