"""Dramatiq's side of ``bench.peers``: a Redis broker, the Results middleware with a Redis
backend (kept only where a caller waits: the last message of a pipeline and a group's
callback), and GroupCallbacks for the fan-out's gather. Configured from
``BENCH_PEERS_REDIS_URL`` at import, so the worker and the client build the same broker."""

import os
import time

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import GroupCallbacks
from dramatiq.rate_limits.backends import RedisBackend as RateLimiterBackend
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

URL = os.environ.get("BENCH_PEERS_REDIS_URL", "redis://127.0.0.1:6379/15")

broker = RedisBroker(url=URL)
results = RedisBackend(url=URL)
broker.add_middleware(Results(backend=results))
broker.add_middleware(GroupCallbacks(RateLimiterBackend(url=URL)))
dramatiq.set_broker(broker)


@dramatiq.actor(max_retries=0)  # type: ignore[untyped-decorator]
def noop() -> float:
    """Returns when it ran: the last step's result is the end of its chain."""
    return time.time()


@dramatiq.actor(max_retries=0)  # type: ignore[untyped-decorator]
def gather() -> float:
    return time.time()
