"""What each worker holds, read from the broker as a peer reaping it would read it."""

import base64
import json
import uuid
from dataclasses import dataclass
from typing import cast

import redis

from service.platform.constants import WORKER_HELD_KEY_PREFIX, WORKERS_KEY


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
            raw = broker.hget("unacked", tag)
            if raw is not None:
                messages.append(_held(json.loads(raw)[0]))
        found[worker] = messages
    return found


def _held(payload: dict[str, object]) -> Held:
    headers = payload["headers"]
    body = payload["body"]
    assert isinstance(headers, dict) and isinstance(body, str)
    args, _kwargs, _embed = json.loads(base64.b64decode(body))
    return Held(str(headers["task"]), str(args[0]) if args else None)


def held_jobs(broker: redis.Redis, pid: int) -> set[uuid.UUID]:
    """The jobs whose messages the worker whose main process is ``pid`` holds."""
    held = held_by(broker, pid).values()
    return {uuid.UUID(m.job_id) for found in held for m in found if m.job_id is not None}
