"""``GET /v1/queues``: what waits in each queue, since when, and which workers take from it."""

from datetime import datetime

import redis
from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from api.deps import Reader, broker_probe
from api.schemas import UtcDatetime
from service.platform.clock import utcnow
from service.platform.errors import BrokerUnavailable
from service.platform.settings import Settings
from tasks.broker import QueueState, queue_states

router = APIRouter(tags=["queues"])


class QueuePublic(BaseModel):
    name: str
    depth: int = Field(description="messages waiting, at every priority")
    by_priority: dict[int, int] = Field(
        description="messages waiting at each priority, highest first"
    )
    oldest_sent_at: UtcDatetime | None = Field(description="when the oldest waiting one was sent")
    oldest_age_s: float | None
    workers: list[str] = Field(description="live workers consuming it; none: its steps wait")

    @classmethod
    def of(cls, state: QueueState, now: datetime) -> "QueuePublic":
        sent = state.oldest_sent
        return cls(
            name=state.name,
            depth=state.depth,
            by_priority=state.by_priority,
            oldest_sent_at=sent,
            oldest_age_s=None if sent is None else round(max(0.0, (now - sent).total_seconds()), 3),
            workers=state.workers,
        )


class QueueList(BaseModel):
    queues: list[QueuePublic]


def read_queues(settings: Settings) -> list[QueueState]:
    try:
        with broker_probe(settings) as client:
            return queue_states(client, settings.worker_dead_after_s)
    except redis.RedisError as exc:
        raise BrokerUnavailable("the broker did not answer", {"error": str(exc)}) from exc


@router.get("/v1/queues", response_model=QueueList)
def list_queues(request: Request, _: Reader) -> QueueList:
    """Every queue that holds a message or that a live worker consumes, and the default one.
    A queue a step names before any worker consumes it is listed with no workers: its steps
    wait there, pending, until a worker of that pool starts."""
    now = utcnow()
    states = read_queues(request.app.state.settings)
    return QueueList(queues=[QueuePublic.of(state, now) for state in states])
