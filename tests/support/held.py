"""What each worker holds, read from the broker as a peer reaping it would read it."""

import json
import uuid
from dataclasses import dataclass
from typing import cast

import redis

from service.platform.constants import UNACKED_KEY, WORKER_HELD_KEY_PREFIX, WORKERS_KEY
from tasks.broker import job_of


@dataclass(frozen=True)
class Held:
    task: str
    job_id: str | None
    """``None`` for a message of no job (the sweeper's)."""


def held_by(broker: redis.Redis, pid: int | None = None) -> dict[str, list[Held]]:
    """Each registered worker's messages still unacknowledged (task name and job id), or only
    those of the worker whose main process is ``pid``."""
    found: dict[str, list[Held]] = {}
    for raw_worker in cast(list[bytes], broker.zrange(WORKERS_KEY, 0, -1)):
        worker = raw_worker.decode()
        if pid is not None and f":{pid}:" not in worker:
            continue
        messages: list[Held] = []
        for tag in broker.smembers(f"{WORKER_HELD_KEY_PREFIX}{worker}"):
            raw = broker.hget(UNACKED_KEY, tag)
            if raw is not None:
                messages.append(_held(raw))
        found[worker] = messages
    return found


def _held(raw: bytes | str) -> Held:
    headers = json.loads(raw)[0]["headers"]
    job = job_of(raw)
    return Held(str(headers["task"]), None if job is None else str(job))


def held_jobs(broker: redis.Redis, pid: int) -> set[uuid.UUID]:
    """The jobs whose messages the worker whose main process is ``pid`` holds."""
    held = held_by(broker, pid).values()
    return {uuid.UUID(m.job_id) for found in held for m in found if m.job_id is not None}
