"""What the sweeper reads from the broker: whether it lost what it held, and how far behind the
steps queue is. Importing it builds no Celery app."""

import json
from datetime import UTC, datetime

import redis

from service.clock import utcnow
from service.constants import BROKER_EPOCH_KEY, HEADER_SENT_AT, QUEUE_STEPS


def read_broker(broker_url: str) -> tuple[bool, datetime | None]:
    """Whether the broker lost what it held (a marker key vanishes when Redis restarts without
    persistence or is flushed), and when the oldest step message still waiting was sent."""
    client = redis.Redis.from_url(broker_url)
    try:
        lost = bool(client.set(BROKER_EPOCH_KEY, utcnow().isoformat(), nx=True))
        return lost, oldest_waiting(client, QUEUE_STEPS)
    finally:
        client.close()


def oldest_waiting(client: redis.Redis, queue: str) -> datetime | None:
    """kombu pushes a message onto the left of its queue's list and workers pop from the right,
    so the rightmost is the next to go: every message sent before it has left the queue. One
    whose send time cannot be read counts as sent now, which holds back stall detection
    rather than repeating what may still be waiting."""
    raw = client.lindex(queue, -1)
    if raw is None:
        return None
    try:
        sent = json.loads(raw)["headers"][HEADER_SENT_AT]
        return datetime.fromtimestamp(float(sent), UTC)
    except (ValueError, KeyError, TypeError):
        return utcnow()
