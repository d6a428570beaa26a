"""Which worker holds which message, so that the messages of a dead worker run again at once.

kombu's Redis transport emulates acknowledgements: a message a worker takes leaves its queue
for the ``unacked`` hash, and comes back only when it has been there longer than the
visibility timeout (kombu's ``restore_visible``) or when the worker shuts down cleanly. A
worker killed as a whole (SIGKILL, OOM, a lost machine) takes no part in either, so the
messages it had prefetched but not started waited the whole visibility timeout, five minutes
by default, although nothing was running them. Shortening that timeout for everyone would
send a long step's message to a second worker while the first still runs it (kombu issue
#337, Celery issue #5935), and restoring every unacknowledged message when a worker starts
(kombu #905) would take those of live workers too.

Here each worker announces itself: its main process writes its heartbeat into the
``WORKERS_KEY`` sorted set every ``worker_heartbeat_s``, and the transport notes the delivery
tag of each message it takes in that worker's ``held`` set, in the same round trip that moves
the message into ``unacked`` (``tasks.transport.QoS``). A live worker whose peers' heartbeats
are older than ``worker_dead_after_s`` restores their held messages to the head of their
queues through kombu's own ``restore_by_tag``, which takes each from ``unacked`` at most once
however many workers try. A busy worker's main process goes on beating while its pool runs
long steps, so what it holds stays its own.

A worker that was only cut off may come back still holding messages that ran elsewhere
meanwhile: a step's claim in PostgreSQL makes it settle once, and the late copy finds it
settled, or held by a live lease and waits for it.
"""

import logging
import os
import threading
import uuid
from collections.abc import Iterable
from typing import Any, cast

import redis
from celery import Celery, bootsteps

from service.platform.brokers import redis_client
from service.platform.constants import (
    WORKER_HELD_KEY_PREFIX,
    WORKER_QUEUES_KEY,
    WORKER_REAP_LOCK_PREFIX,
    WORKERS_KEY,
)
from service.platform.metrics import WORKER_MESSAGES_RESTORED
from tasks import runtime

log = logging.getLogger(__name__)

_holder: str | None = None
"""The ``held`` set of this process's worker, once it is one."""

_BEGIN_REAP = """
local beat = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not beat or tonumber(beat) > tonumber(ARGV[2]) then return false end
if not redis.call('SET', KEYS[3], ARGV[3], 'NX', 'PX', ARGV[4]) then return false end
return redis.call('SMEMBERS', KEYS[2])
"""
"""A worker still silent since the cut-off, and no peer reaping it: the tags it holds."""

_END_REAP = """
local beat = redis.call('ZSCORE', KEYS[1], ARGV[1])
if beat and tonumber(beat) <= tonumber(ARGV[2]) then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('DEL', KEYS[2])
end
if redis.call('GET', KEYS[3]) == ARGV[3] then redis.call('DEL', KEYS[3]) end
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then redis.call('HDEL', KEYS[4], ARGV[1]) end
return 0
"""
"""Forget the worker unless it beat again meanwhile: then it is alive, and keeps its set."""


def holder() -> str | None:
    return _holder


def held_key(worker: str) -> str:
    return f"{WORKER_HELD_KEY_PREFIX}{worker}"


class Liveness:
    """One worker's heartbeat, and the reaping of its dead peers, on one daemon thread.
    ``client`` decodes responses."""

    def __init__(
        self,
        app: Celery,
        client: redis.Redis,
        worker: str,
        interval_s: float,
        dead_after_s: float,
        queues: Iterable[str] = (),
    ) -> None:
        self.app = app
        self.client = client
        self.worker = worker
        self.queues = ",".join(sorted(queues))
        """The kombu queues it consumes, for whoever lists which workers serve a queue."""
        self.interval_s = interval_s
        self.dead_after_s = dead_after_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="liveness", daemon=True)

    def start(self) -> None:
        """The first beat is written before the worker consumes, so no message is held by a
        worker nobody knows of."""
        self._beat_and_reap()
        self._thread.start()

    def stop(self) -> None:
        """A clean stop has given its messages back (kombu restores them at shutdown); a
        heartbeat of zero has a peer restore at once any that it could not."""
        self._stop.set()
        self._thread.join(timeout=self.interval_s + 1)
        try:
            self.client.zadd(WORKERS_KEY, {self.worker: 0})
        except redis.RedisError:
            log.warning("could not mark worker %s stopped", self.worker)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._beat_and_reap()

    def _beat_and_reap(self) -> None:
        try:
            now = self._now()
            with self.client.pipeline(transaction=False) as pipe:
                pipe.zadd(WORKERS_KEY, {self.worker: now})
                pipe.hset(WORKER_QUEUES_KEY, self.worker, self.queues)
                pipe.execute()
            dead = self.client.zrangebyscore(WORKERS_KEY, "-inf", now - self.dead_after_s)
            for worker in cast(list[str], dead):
                self.reap(worker, now - self.dead_after_s)
        except redis.RedisError as exc:
            log.warning("worker heartbeat failed: %s", exc)

    def _now(self) -> float:
        seconds, micros = self.client.time()
        return float(seconds) + micros / 1e6

    def reap(self, worker: str, cutoff: float) -> int:
        """Restore what ``worker`` held if it has been silent since ``cutoff``; how many."""
        token = uuid.uuid4().hex
        keys = (
            WORKERS_KEY,
            held_key(worker),
            f"{WORKER_REAP_LOCK_PREFIX}{worker}",
            WORKER_QUEUES_KEY,
        )
        lock_ms = int(max(self.dead_after_s, 10.0) * 1000)
        tags = self.client.eval(_BEGIN_REAP, 3, *keys[:3], worker, cutoff, token, lock_ms)
        if tags is None:
            return 0
        restored = restore(self.app, cast(list[str], tags))
        self.client.eval(_END_REAP, 4, *keys, worker, cutoff, token)
        if restored:
            WORKER_MESSAGES_RESTORED.inc(restored)
            log.warning("restored %d messages held by the dead worker %s", restored, worker)
        return restored


def restore(app: Celery, tags: Iterable[str]) -> int:
    """Each tag back to the head of its queue, as kombu's visibility restore sends it, if it
    is still unacknowledged; how many were."""
    restored = 0
    with app.connection_for_write() as connection:
        channel: Any = connection.default_channel
        for tag in tags:
            if channel.client.hexists(channel.unacked_key, tag):
                channel.qos.restore_by_tag(tag)
                restored += 1
    return restored


class LivenessStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """Starts before the consumer (which Celery starts last) and stops after it. Added only
    where flowbeat's transport (``tasks.transport``) notes what each worker holds."""

    requires = ("celery.worker.components:Pool",)

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.liveness: Liveness | None = None

    def start(self, worker: Any) -> None:
        global _holder
        settings = runtime.settings()
        name = f"{worker.hostname}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        client = redis_client(settings.broker(), decode_responses=True)
        self.liveness = Liveness(
            worker.app,
            client,
            name,
            settings.worker_heartbeat_s,
            settings.worker_dead_after_s,
            worker.app.amqp.queues.consume_from or worker.app.amqp.queues,
        )
        _holder = held_key(name)
        self.liveness.start()

    def stop(self, worker: Any) -> None:
        if self.liveness is not None:
            self.liveness.stop()
