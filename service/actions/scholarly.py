"""JSON GETs to literature APIs: timeouts, a size cap, a shared rate limit, and retries.

Retries happen inside the action, not only through the engine's retry policy: a summary of
1,000 PMIDs is five requests, and one 429 on the fourth should not throw away the first three
or depend on every profile declaring a retry policy. Each request is tried
``LITERATURE_HTTP_ATTEMPTS`` times on 429, 5xx, timeouts and transport errors, waiting what
``Retry-After`` asks (capped) or an exponential backoff. When that is exhausted the
``ActionError`` is retryable, so a step's own ``retry`` policy can still take over later.
"""

import email.utils
import json
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import httpx
import redis

from service.actions.context import StepContext
from service.actions.http import _read_capped
from service.platform.constants import LITERATURE_HTTP_ATTEMPTS, LITERATURE_RETRY_AFTER_MAX_S
from service.platform.egress import EgressPolicy, guarded_client
from service.platform.errors import ActionError
from service.platform.ratelimit import RateLimiter

BACKOFF_BASE_S = 0.5


def bad_inputs(action: str, message: str) -> ActionError:
    return ActionError(f"{action}: {message}", {"reason": "bad_inputs"}, retryable=False)


def retry_after_s(header: str | None, fallback_s: float) -> float:
    """Seconds from a ``Retry-After`` header (delta seconds or an HTTP date), capped."""
    if header is None:
        return fallback_s
    value = header.strip()
    if value.isdigit():
        return min(float(value), LITERATURE_RETRY_AFTER_MAX_S)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return fallback_s
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    delay = (when - datetime.now(UTC)).total_seconds()
    return min(max(delay, 0.0), LITERATURE_RETRY_AFTER_MAX_S)


def _take_slot(action: str, limiter: RateLimiter, ctx: StepContext) -> None:
    try:
        limiter.acquire(sleep=ctx.sleep)
    except TimeoutError as exc:
        raise ActionError(f"{action}: {exc}", {"reason": "rate_limited"}) from exc
    except redis.RedisError as exc:
        raise ActionError(
            f"{action}: the rate limit in Redis is unavailable: {exc}", {"reason": "rate_limit"}
        ) from exc


def get_json(
    ctx: StepContext,
    action: str,
    url: str,
    params: Mapping[str, Any],
    limiter: RateLimiter | None = None,
) -> Any:
    """GET ``url`` and decode JSON; see the module docstring for what is retried."""
    policy = EgressPolicy.from_settings(ctx.settings, action)
    failure: ActionError | None = None
    with guarded_client(policy, follow_redirects=False) as client:
        for attempt in range(1, LITERATURE_HTTP_ATTEMPTS + 1):
            ctx.check_cancelled()
            if limiter is not None:
                _take_slot(action, limiter, ctx)
            backoff = BACKOFF_BASE_S * 2 ** (attempt - 1)
            try:
                with client.stream("GET", url, params=dict(params)) as response:
                    deadline = time.monotonic() + policy.timeout_s
                    raw = _read_capped(ctx, response, policy.max_bytes, deadline, url)
            except httpx.TransportError as exc:
                failure = ActionError(
                    f"{action}: GET {url} failed: {type(exc).__name__}: {exc}",
                    {"reason": "transport", "attempts": attempt},
                )
                if attempt < LITERATURE_HTTP_ATTEMPTS:
                    ctx.sleep(backoff)
                continue
            status = response.status_code
            if status == 429 or status >= 500:
                failure = ActionError(
                    f"{action}: GET {url} returned HTTP {status}",
                    {"reason": "http_status", "status": status, "attempts": attempt},
                )
                if attempt < LITERATURE_HTTP_ATTEMPTS:
                    ctx.sleep(retry_after_s(response.headers.get("retry-after"), backoff))
                continue
            if status >= 400:
                raise ActionError(
                    f"{action}: GET {url} returned HTTP {status}",
                    {
                        "reason": "http_status",
                        "status": status,
                        "body": raw[:500].decode(errors="replace"),
                    },
                    retryable=False,
                )
            try:
                return json.loads(raw)
            except ValueError as exc:
                raise ActionError(
                    f"{action}: GET {url} did not return JSON: {exc}",
                    {"reason": "bad_json", "body": raw[:500].decode(errors="replace")},
                    retryable=False,
                ) from exc
    assert failure is not None
    raise failure
