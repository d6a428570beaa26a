"""Where a step's message waits: one Redis list per queue and priority.

A queue is a pool of workers (``flowbeat worker --queues gpu,default``): ``default`` is the
``flowbeat.steps`` list every worker consumed before there were queues, any other name is
``flowbeat.steps.<name>``. Within a queue kombu's Redis transport keeps one list per priority
level and names them in one ``BRPOP``, lowest level first. flowbeat's priorities run the other
way (0-9, higher first, as Celery's on RabbitMQ, Hatchet's and Temporal's do), so a job of
priority ``p`` is sent at kombu's level ``10 - p`` (kombu takes a level of 0 for none given);
the default, 0, keeps the queue's own list (``tasks.transport.Channel``), where it always
was. Which queues and levels exist is kept nowhere: a queue is every list with the prefix.
"""

import redis

from service.platform.constants import DEFAULT_QUEUE, MAX_PRIORITY, QUEUE_STEPS

PRIORITY_SEP = "\x06\x16"
"""kombu's separator between a queue's name and a priority level (``Channel.sep``)."""
DEFAULT_LEVEL = MAX_PRIORITY + 1
BROKER_LEVELS = list(range(1, DEFAULT_LEVEL + 1))
"""kombu's ``priority_steps``: one list per level, so no two priorities share one."""


def queue_name(queue: str) -> str:
    """The kombu queue of the flowbeat queue ``queue``."""
    return QUEUE_STEPS if queue == DEFAULT_QUEUE else f"{QUEUE_STEPS}.{queue}"


def queue_of(name: str) -> str | None:
    """The flowbeat queue a kombu queue is, or ``None`` for another (the control queue)."""
    if name == QUEUE_STEPS:
        return DEFAULT_QUEUE
    prefix = f"{QUEUE_STEPS}."
    return name[len(prefix) :] if name.startswith(prefix) else None


def broker_level(priority: int) -> int:
    """kombu's level for a flowbeat priority, in a message's ``priority`` property."""
    return DEFAULT_LEVEL - priority


def priority_of(level: int | None) -> int:
    """The flowbeat priority of a message at kombu's ``level`` (none: the default)."""
    if not level:
        return 0
    return DEFAULT_LEVEL - max(1, min(int(level), DEFAULT_LEVEL))


def list_key(name: str, level: int) -> str:
    """The Redis list of kombu queue ``name`` at ``level``."""
    return name if level == DEFAULT_LEVEL else f"{name}{PRIORITY_SEP}{level}"


def step_list(queue: str, priority: int) -> str:
    return list_key(queue_name(queue), broker_level(priority))


def queue_lists(name: str) -> list[str]:
    """Every list of kombu queue ``name``, in the order a worker takes from them."""
    return [list_key(name, level) for level in BROKER_LEVELS]


def route_of(key: str) -> tuple[str, int] | None:
    """The queue and priority of a step list, or ``None`` for a key that is not one."""
    name, sep, level = key.partition(PRIORITY_SEP)
    queue = queue_of(name)
    if queue is None:
        return None
    if not sep:
        return queue, 0
    return (queue, priority_of(int(level))) if level.isdigit() else None


def step_lists(client: redis.Redis) -> list[str]:
    """Every step list that holds a message: Redis drops a list when its last one leaves."""
    pattern = f"{QUEUE_STEPS}*"
    keys = (k.decode() if isinstance(k, bytes) else k for k in client.scan_iter(pattern, 1000))
    return sorted(key for key in keys if route_of(key) is not None)
