"""Actions for end-to-end tests and fault drills: side effects a test can count from outside."""

import os
import time
from typing import Any

import redis

from service.actions import StepContext, action

KEY_TTL_S = 3600
"""Counters outlive a flush of the broker's DB, not the test run that reads them."""


def _redis() -> redis.Redis:
    return redis.Redis.from_url(os.environ["FLOWBEAT_BROKER_URL"].rsplit("/", 1)[0] + "/0")


def _key(ctx: StepContext, name: str) -> str:
    return f"drill:{ctx.job_id}:{name}"


def _bump(client: redis.Redis, key: str) -> None:
    with client.pipeline() as pipe:
        pipe.incr(key)
        pipe.expire(key, KEY_TTL_S)
        pipe.execute()


@action("drill.count")
def count(ctx: StepContext, name: str, value: Any = None, hold_s: float = 0.0) -> dict[str, Any]:
    """Count one execution in Redis DB 0 (which flushing the broker's DB does not touch)."""
    client = _redis()
    _bump(client, _key(ctx, f"{name}:started"))
    client.set(_key(ctx, f"{name}:pid"), os.getpid(), ex=KEY_TTL_S)
    deadline = time.monotonic() + hold_s
    while time.monotonic() < deadline:
        ctx.sleep(min(0.1, max(deadline - time.monotonic(), 0.0)))
    _bump(client, _key(ctx, f"{name}:finished"))
    return {"name": name, "value": value}
