"""``GET /v1/rate-limits``: each step rate-limit key's limit, use and waiting steps."""

import redis
from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from api.deps import Reader, SessionDep
from api.routes.jobs import visible_to
from api.schemas import UtcDatetime
from service.engine.ratekeys import RateKeyUse, rate_keys
from service.platform.errors import BrokerUnavailable
from service.platform.ratelimit import redis_client

router = APIRouter(tags=["rate limits"])


class WaitingStepPublic(BaseModel):
    job_id: str
    step_id: str
    parked_at: UtcDatetime = Field(description="when it first found the window full")
    wake_at: UtcDatetime = Field(description="when the window is next due to have room for it")


class RateKeyPublic(BaseModel):
    key: str = Field(description="the key with its params resolved, shared by every owner")
    limit: int = Field(description="units let through in any window")
    window_s: float = Field(description="the window, in seconds, with the start guard")
    used: int = Field(description="units granted within the last window")
    waiting: int = Field(description="steps parked for the key, of every owner")
    next_wake_at: UtcDatetime | None = Field(description="when the first of them is due")
    configured: bool = Field(description="its limit comes from the settings (the NCBI limit)")
    steps: list[WaitingStepPublic] = Field(
        description="the oldest waiting steps of the jobs the caller may see, next first"
    )

    @classmethod
    def of(cls, use: RateKeyUse) -> "RateKeyPublic":
        steps = [WaitingStepPublic(**vars(step)) for step in use.steps]
        return cls(**{**vars(use), "window_s": round(use.window_s, 3), "steps": steps})


class RateKeyList(BaseModel):
    keys: list[RateKeyPublic]


@router.get("/v1/rate-limits", response_model=RateKeyList)
def list_rate_limits(request: Request, principal: Reader, session: SessionDep) -> RateKeyList:
    """Every rate-limit key with a grant in its window, a step waiting for it, or a limit
    configured by the settings."""
    settings = request.app.state.settings
    try:
        uses = rate_keys(session, redis_client(settings.broker()), settings, visible_to(principal))
    except redis.RedisError as exc:
        raise BrokerUnavailable("the broker did not answer", {"error": str(exc)}) from exc
    return RateKeyList(keys=[RateKeyPublic.of(use) for use in uses])
