"""What the sweeper reads from the broker: whether it lost what it held, how far behind each
step list is, and which jobs' messages workers hold; and what waits in each queue, for the
API and the CLI. Importing it builds no Celery app."""

import base64
import binascii
import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import redis

from service.platform.brokers import BrokerAddress, redis_client
from service.platform.clock import utcnow
from service.platform.constants import (
    BROKER_EPOCH_KEY,
    DEFAULT_QUEUE,
    HEADER_SENT_AT,
    UNACKED_KEY,
    WORKER_QUEUES_KEY,
    WORKERS_KEY,
)
from tasks.liveness import held_key
from tasks.queues import queue_of, route_of, step_lists


@dataclass(frozen=True)
class BrokerState:
    lost: bool
    """The marker key was gone: Redis restarted without persistence or was flushed."""
    oldest_waiting: dict[tuple[str, int], datetime]
    """When the oldest message still waiting in each step list was sent, by queue and
    priority (``tasks.queues``)."""
    epoch: str
    """The marker this pass set when ``lost``, for ``forget_loss`` to take back."""
    held: frozenset[uuid.UUID]
    """The jobs with a message some worker has taken and not acknowledged, read after
    ``oldest_waiting``: a message that left the queue in between is in here; and the jobs
    whose message is next in a list, which a queue no worker consumes keeps there."""


_DELETE_IF_OURS = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def read_broker(broker: BrokerAddress | str) -> BrokerState:
    """The marker key is set again by the pass that finds it gone, so the next pass does not
    see the same loss twice; a pass that fails before it has sent every open job again takes
    its marker back with ``forget_loss``."""
    client = redis_client(broker)
    epoch = f"{utcnow().isoformat()} {uuid.uuid4().hex}"
    try:
        lost = bool(client.set(BROKER_EPOCH_KEY, epoch, nx=True))
        waiting = waiting_since(client)
        return BrokerState(lost, waiting, epoch, held_jobs(client) | next_jobs(client))
    finally:
        client.close()


def forget_loss(broker: BrokerAddress | str, epoch: str) -> None:
    """Delete the marker only if it is still the one ``epoch`` set: a later restart's loss,
    marked by another pass, is not this pass's to forget."""
    client = redis_client(broker)
    try:
        client.eval(_DELETE_IF_OURS, 1, BROKER_EPOCH_KEY, epoch)
    finally:
        client.close()


def waiting_since(client: redis.Redis) -> dict[tuple[str, int], datetime]:
    """``oldest_waiting`` of every step list that holds a message."""
    oldest = {}
    for key in step_lists(client):
        route, sent = route_of(key), oldest_waiting(client, key)
        if route is not None and sent is not None:
            oldest[route] = sent
    return oldest


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


def next_jobs(client: redis.Redis) -> frozenset[uuid.UUID]:
    """The job of the next message of every step list: however long it has waited, it is
    queued, not lost (a pool with no worker yet, or behind a backlog)."""
    jobs = set()
    for key in step_lists(client):
        raw = client.lindex(key, -1)
        job = None if raw is None else _job_in(raw)
        if job is not None:
            jobs.add(job)
    return frozenset(jobs)


def held_jobs(client: redis.Redis) -> frozenset[uuid.UUID]:
    """Every job named by a message in kombu's ``unacked`` hash: prefetched and not started,
    running, or waiting for its retry's countdown, by a live worker or one not yet reaped. A
    message that cannot be read is not ours, or names no job (the sweeper's own)."""
    jobs = set()
    for raw in client.hvals(UNACKED_KEY):
        job = job_of(raw)
        if job is not None:
            jobs.add(job)
    return frozenset(jobs)


def job_of(raw: bytes | str) -> uuid.UUID | None:
    """The job a message in ``unacked`` (``[payload, exchange, routing_key]``) is for: the
    first argument of every step, lane and compensation task."""
    try:
        return _job_of_payload(json.loads(raw)[0])
    except (ValueError, KeyError, IndexError, TypeError):
        return None


def _job_in(raw: bytes | str) -> uuid.UUID | None:
    """The job a message in a queue's list (kombu's envelope alone) is for."""
    try:
        return _job_of_payload(json.loads(raw))
    except ValueError:
        return None


def _job_of_payload(payload: Any) -> uuid.UUID | None:
    try:
        args = json.loads(base64.b64decode(payload["body"]))[0]
        return uuid.UUID(args[0]) if args else None
    except (ValueError, KeyError, IndexError, TypeError, binascii.Error):
        return None


@dataclass(frozen=True)
class QueueState:
    """One queue as a person running its pool sees it."""

    name: str
    depth: int
    by_priority: dict[int, int]
    oldest_sent: datetime | None
    workers: list[str]


def queue_states(client: redis.Redis, dead_after_s: float) -> list[QueueState]:
    """Every queue that holds a message or that a live worker consumes, the default queue
    always: what waits in it, since when, and who takes from it. A queue nobody consumes is
    listed with no workers, since a step may name a pool that has not started yet."""
    depths: dict[str, dict[int, int]] = {}
    oldest: dict[str, datetime] = {}
    for key in step_lists(client):
        route = route_of(key)
        sent = oldest_waiting(client, key)
        if route is None:
            continue
        queue, priority = route
        depths.setdefault(queue, {})[priority] = int(client.llen(key))
        if sent is not None and (queue not in oldest or sent < oldest[queue]):
            oldest[queue] = sent
    workers = _consumers(client, dead_after_s)
    names = {DEFAULT_QUEUE, *depths, *workers}
    return [
        QueueState(
            name,
            sum(depths.get(name, {}).values()),
            dict(sorted(depths.get(name, {}).items(), reverse=True)),
            oldest.get(name),
            sorted(workers.get(name, [])),
        )
        for name in sorted(names)
    ]


def _alive(client: redis.Redis, dead_after_s: float) -> list[tuple[bytes, float]]:
    """The workers that beat within ``dead_after_s``, by Redis's clock, and when they did."""
    seconds, micros = client.time()
    since = seconds + micros / 1e6 - dead_after_s
    return cast(
        list[tuple[bytes, float]],
        client.zrangebyscore(WORKERS_KEY, since, "+inf", withscores=True),
    )


def _queues_of(raw: bytes | str | None) -> list[str]:
    names = (queue_of(name) for name in _text(raw).split(","))
    return sorted({name for name in names if name is not None})


def _consumers(client: redis.Redis, dead_after_s: float) -> dict[str, list[str]]:
    """The live workers of each queue, as they announce themselves (``tasks.liveness``)."""
    alive = [worker for worker, _ in _alive(client, dead_after_s)]
    if not alive:
        return {}
    consumers: dict[str, list[str]] = {}
    for worker, queues in zip(alive, client.hmget(WORKER_QUEUES_KEY, alive), strict=True):
        for queue in _queues_of(queues):
            consumers.setdefault(queue, []).append(_text(worker))
    return consumers


@dataclass(frozen=True)
class Taken:
    """A message a worker has taken and not acknowledged: the task it runs, or with
    prefetching on, may be about to run."""

    task: str
    task_id: str | None
    """The id a step claims under, and the steps a chain runs after it in the same message."""
    job_id: uuid.UUID | None
    step_id: str | None
    """The step the message was sent for."""


@dataclass(frozen=True)
class WorkerState:
    name: str
    queues: list[str]
    beat_at: datetime
    taken: list[Taken]


def worker_states(client: redis.Redis, dead_after_s: float) -> list[WorkerState]:
    """Every live worker, its queues and what it holds, in three round trips: the liveness
    set, each worker's queues and ``held`` set, and the held messages in ``unacked``."""
    alive = _alive(client, dead_after_s)
    with client.pipeline(transaction=False) as pipe:
        for worker, _ in alive:
            pipe.hget(WORKER_QUEUES_KEY, worker)
            pipe.smembers(held_key(_text(worker)))
        answers = pipe.execute()
    queues, held = answers[0::2], [sorted(_text(tag) for tag in tags) for tags in answers[1::2]]
    tags = [tag for worker_tags in held for tag in worker_tags]
    messages = dict(zip(tags, client.hmget(UNACKED_KEY, tags), strict=True)) if tags else {}
    return [
        WorkerState(
            _text(worker),
            _queues_of(worker_queues),
            datetime.fromtimestamp(beat, UTC),
            [taken for tag in worker_tags if (taken := _taken(messages.get(tag))) is not None],
        )
        for (worker, beat), worker_queues, worker_tags in zip(alive, queues, held, strict=True)
    ]


def _taken(raw: bytes | str | None) -> Taken | None:
    """``None`` for a tag whose message was acknowledged since its set was read."""
    if raw is None:
        return None
    try:
        payload = json.loads(raw)[0]
        headers = payload["headers"]
        args = json.loads(base64.b64decode(payload["body"]))[0]
    except (ValueError, KeyError, IndexError, TypeError, binascii.Error):
        return Taken("unknown", None, None, None)
    return Taken(
        str(headers.get("task")),
        _str(headers.get("id")),
        _uuid(args[0] if args else None),
        _str(args[1] if len(args) > 1 else None),
    )


def _uuid(value: Any) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _text(value: bytes | str | None) -> str:
    return value.decode() if isinstance(value, bytes) else (value or "")
