"""What a publish costs: kombu's Redis transport minus a client object built per publish, and
a router that spares the per-message work a Redis broker and id-only arguments do not need.

kombu wraps its connection pool in a new ``redis.Redis`` for every message it sends, and
redis-py fills a table of some 170 response callbacks each time: about a fifth of the CPU of a
publish, paid by the API on every job and by workers on every step of a chain. One client per
pool is enough, since a ``redis.Redis`` is thread-safe and holds no connection of its own.

The same channel also keeps a worker alive when Redis goes away (see ``Channel``), and names
each queue's priority lists so that flowbeat's default priority keeps the queue's own list
(``tasks.queues``).
"""

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from kombu.transport import TRANSPORT_ALIASES, virtual
from kombu.transport import redis as kombu_redis
from kombu.utils.json import dumps
from redis.exceptions import ConnectionError as RedisConnectionError

from service.platform import tracing
from service.platform.constants import HEADER_SENT_AT
from tasks import liveness
from tasks.queues import BROKER_LEVELS, DEFAULT_LEVEL, list_key


class QoS(kombu_redis.QoS):
    """kombu's acknowledgement emulation, which also notes each message a worker takes in
    that worker's ``held`` set (``tasks.liveness``), in the round trip that moves it into
    ``unacked``, and drops it there in the round trip that acknowledges it."""

    def append(self, message: Any, delivery_tag: str) -> None:
        delivery = message.delivery_info
        raw = dumps([message._raw, delivery["exchange"], delivery["routing_key"]])  # type: ignore[no-untyped-call]
        with self.pipe_or_acquire() as pipe:
            pipe.zadd(self.unacked_index_key, {delivery_tag: time.time()})
            pipe.hset(self.unacked_key, delivery_tag, raw)
            held = liveness.holder()
            if held is not None:
                pipe.sadd(held, delivery_tag)
            pipe.execute()
        virtual.QoS.append(self, message, delivery_tag)  # type: ignore[no-untyped-call]

    def _remove_from_indices(self, delivery_tag: str, pipe: Any = None) -> Any:
        pipe = super()._remove_from_indices(delivery_tag, pipe)  # type: ignore[no-untyped-call]
        held = liveness.holder()
        return pipe if held is None else pipe.srem(held, delivery_tag)


class Channel(kombu_redis.Channel):
    """When the broker connection breaks, Celery's consumer detaches it from its transport
    (``Connection.collect``), then closes it, ignoring connection errors only. When Redis
    vanished while the steps channel waited on BRPOP, that channel's close fails on the dead
    socket during the detaching, and the transport's own sweep over its channels can stop at
    another that fails first (the remote-control one), so the channel is still open at the
    second close. It then restores its unacknowledged messages through a pool rebuilt from the
    detached transport, and kombu fails with an ``AttributeError`` (kombu issues #582, #970):
    the worker stops for good ("Unrecoverable error") and no step runs again. Here that restore
    fails as the lost connection it is, which the consumer survives; Redis keeps those messages
    until their visibility timeout or, restarted empty, lost them with everything the sweeper
    sends again."""

    _shared_client: Any = None
    _shared_for: Any = None

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
            return
        transport = self.connection
        if self._pool is None and (transport is None or transport.client is None):
            raise RedisConnectionError("the broker connection was closed")
        pool = self.pool
        if self._shared_for is not pool:
            shared = self._create_client()  # type: ignore[no-untyped-call]
            self._shared_client, self._shared_for = shared, pool
        yield self._shared_client

    QoS = QoS

    def _basic_cancel(self, consumer_tag: str) -> Any:
        """A worker stops consuming at the start of its warm shutdown, then waits for its pool
        to finish what it runs; the ``BRPOP`` it sent before stays blocked on Redis and pops
        the next message sent to its queues (a sweep, a step), which kombu reads only when it
        closes the channel, after the pool has drained, and hands back only through another
        channel still open ("Requeuing undeliverable message"): a message nobody runs, held
        by a process that a rolling restart may kill at the end of its grace period. Once no
        queue is left, the ``BRPOP`` is ended now and whatever it took goes back."""
        cancelled = super()._basic_cancel(consumer_tag)  # type: ignore[no-untyped-call]
        if not self.active_queues and self._in_poll:
            self._give_back_brpop()
        return cancelled

    def _give_back_brpop(self) -> None:
        """Its reply read at once where Redis can end it (``CLIENT UNBLOCK``, as if it timed
        out), else within its own timeout (``brpop_timeout``); a message it popped is pushed
        back onto the end of the list it came from, the end the next ``BRPOP`` takes from."""
        connection: Any = self._in_poll
        try:
            self._unblock(connection)
            reply = self.client.parse_response(connection, "BRPOP")
        except self.connection_errors:
            connection.disconnect()
            return
        finally:
            self._in_poll = False
        if reply:
            key, item = reply
            with self.conn_or_acquire() as client:
                client.rpush(key, item)

    def _unblock(self, connection: Any) -> None:
        """The blocked connection is found by its address among Redis's clients; none is
        unblocked where the address is not ours to match (a Unix socket, a proxy between) or
        where ``CLIENT`` is not allowed."""
        address = connection._sock.getsockname() if connection._sock is not None else None
        if not isinstance(address, tuple):
            return
        host, port = address[0], address[1]
        ours = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            with self.conn_or_acquire() as client:
                for peer in client.client_list():
                    if peer.get("addr") == ours:
                        client.client_unblock(int(peer["id"]))
        except self.ResponseError:
            return

    priority_steps = BROKER_LEVELS
    default_priority = max_priority = DEFAULT_LEVEL
    """kombu reads a priority of 0 as none given (``priority or default_priority``), so
    flowbeat's levels run from 1, and a message sent with none (the sweeper's, a notice's)
    goes where flowbeat's default priority does: its queue's own list (``tasks.queues``)."""

    def _q_for_pri(self, queue: str, pri: int) -> str:
        return list_key(queue, self.priority(pri))  # type: ignore[no-untyped-call]


class Transport(kombu_redis.Transport):
    Channel = Channel


class SentinelChannel(Channel, kombu_redis.SentinelChannel):
    """The channel above on the primary kombu's Sentinel channel finds: the same priority
    lists, liveness notes and survival of a lost connection, whose next pool asks the
    sentinels again, so a worker follows a failover."""


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = SentinelChannel


def transport_for(broker_url: str | None) -> str | None:
    """This transport for a plain ``redis://`` broker, its Sentinel flavour for a
    ``sentinel://`` one; ``None`` keeps kombu's choice."""
    if broker_url and broker_url.startswith("redis://"):
        return f"{__name__}:{Transport.__name__}"
    if broker_url and broker_url.startswith("sentinel://"):
        return f"{__name__}:{SentinelTransport.__name__}"
    return None


def keep_across_failovers() -> None:
    """Celery fails over to a broker's next URL through kombu's ``Connection.switch``, which
    takes the transport from the URL's scheme again and drops the one the connection was made
    with (kombu says so where it does it). A worker that followed a Sentinel failover went on
    with kombu's own transport: without flowbeat's priority lists and liveness notes, and
    stopped for good by the next lost connection (kombu #582, #970; the Sentinel chaos drill).
    The schemes ``transport_for`` maps name this module's transports for the whole process."""
    TRANSPORT_ALIASES["redis"] = f"{__name__}:{Transport.__name__}"
    TRANSPORT_ALIASES["sentinel"] = f"{__name__}:{SentinelTransport.__name__}"


REDIS_SCHEMES = ("redis", "rediss", "redis+socket", "sentinel")
ARGSREPR_MAX_CHARS = 1024


def message_router(
    broker_url: str | None, queue: str, elsewhere: Mapping[str, str] | None = None
) -> Callable[..., dict[str, Any]]:
    """A Celery router, here for how every message is published as much as where to: to
    ``queue``, or to ``elsewhere``'s queue for the tasks it names.

    On Redis a task message is pushed straight onto its queue's list, which needs no
    declaring, so ``declare=[]`` spares kombu's per-message check that the queue was declared:
    a copy of the queue bound to the channel, paid by the API on every job and by a worker on
    every hop of a chain. Other brokers keep the check, since there a queue nobody declared
    drops what is sent to it. Messages carry ids, so the plain ``repr`` of their arguments is
    short, and given as ``argsrepr`` it spares Celery's ``saferepr``, made for any size.
    Every message carries the moment it was sent: its worker measures from it how long it
    waited, and the sweeper how far the queue is behind.
    """
    declare: dict[str, Any] = {}
    queues = dict(elsewhere or {})
    if (broker_url or "").partition("://")[0] in REDIS_SCHEMES:
        declare["declare"] = []

    def route(
        name: str, args: Any, kwargs: Any, options: dict[str, Any], **_: Any
    ) -> dict[str, Any]:
        headers: dict[str, Any] = {HEADER_SENT_AT: time.time()}
        trace = tracing.traceparent()
        if trace is not None:
            headers[tracing.TRACEPARENT] = trace
        return {
            "queue": queues.get(name, queue),
            **declare,
            "argsrepr": _short_repr(tuple(args or ())),
            "kwargsrepr": _short_repr(kwargs or {}),
            "headers": headers,
        }

    return route


def _short_repr(value: Any) -> str | None:
    """``None`` leaves a long one to Celery, which truncates it."""
    text = repr(value)
    return text if len(text) <= ARGSREPR_MAX_CHARS else None
