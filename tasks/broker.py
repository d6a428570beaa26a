"""What the sweeper reads from the broker: whether it lost what it held, and how far behind the
steps queue is. Importing it builds no Celery app."""

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import redis

from service.platform.clock import utcnow
from service.platform.constants import BROKER_EPOCH_KEY, HEADER_SENT_AT, QUEUE_STEPS


@dataclass(frozen=True)
class BrokerState:
    lost: bool
    """The marker key was gone: Redis restarted without persistence or was flushed."""
    oldest_waiting: datetime | None
    """When the oldest step message still waiting was sent."""
    epoch: str
    """The marker this pass set when ``lost``, for ``forget_loss`` to take back."""


_DELETE_IF_OURS = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def read_broker(broker_url: str) -> BrokerState:
    """The marker key is set again by the pass that finds it gone, so the next pass does not
    see the same loss twice; a pass that fails before it has sent every open job again takes
    its marker back with ``forget_loss``."""
    client = redis.Redis.from_url(broker_url)
    epoch = f"{utcnow().isoformat()} {uuid.uuid4().hex}"
    try:
        lost = bool(client.set(BROKER_EPOCH_KEY, epoch, nx=True))
        return BrokerState(lost, oldest_waiting(client, QUEUE_STEPS), epoch)
    finally:
        client.close()


def forget_loss(broker_url: str, epoch: str) -> None:
    """Delete the marker only if it is still the one ``epoch`` set: a later restart's loss,
    marked by another pass, is not this pass's to forget."""
    client = redis.Redis.from_url(broker_url)
    try:
        client.eval(_DELETE_IF_OURS, 1, BROKER_EPOCH_KEY, epoch)
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
