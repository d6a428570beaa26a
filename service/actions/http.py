"""``http.request``: one HTTP call with a timeout, a response size cap and retry classification,
let out only as far as the egress policy allows (``service.platform.egress``)."""

import json as jsonlib
import time
from collections.abc import Mapping
from typing import Any

import httpx

from service.actions.context import StepContext
from service.actions.registry import action
from service.platform.egress import EgressPolicy, guarded_client
from service.platform.errors import ActionError

ALLOWED_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
ERROR_SNIPPET_CHARS = 500


def _fail(message: str, reason: str, *, retryable: bool, **details: Any) -> ActionError:
    return ActionError(message, {"reason": reason, **details}, retryable=retryable)


def _positive(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise _fail(
            f"http.request: {name} must be a positive number", "bad_inputs", retryable=False
        )
    return float(value)


def _is_json_type(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def _decode(raw: bytes, response: httpx.Response) -> str:
    charset = response.charset_encoding or "utf-8"
    try:
        return raw.decode(charset, errors="replace")
    except LookupError:
        return raw.decode("utf-8", errors="replace")


def _read_capped(
    ctx: StepContext, response: httpx.Response, max_bytes: int, deadline: float, url: str
) -> bytes:
    """Read the body without ever holding more than ``max_bytes`` of it.

    httpx's timeout applies per network operation, so a server that trickles bytes could keep a
    step alive forever; the overall deadline stops that.
    """
    declared = response.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise _fail(
            f"response from {url} declares {declared} bytes, over the {max_bytes}-byte cap",
            "response_too_large",
            retryable=False,
            max_bytes=max_bytes,
        )
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        ctx.check_cancelled()
        size += len(chunk)
        if size > max_bytes:
            raise _fail(
                f"response from {url} exceeds the {max_bytes}-byte cap",
                "response_too_large",
                retryable=False,
                max_bytes=max_bytes,
            )
        if time.monotonic() > deadline:
            raise _fail(f"reading the response from {url} took too long", "timeout", retryable=True)
        chunks.append(chunk)
    return b"".join(chunks)


@action("http.request", cache=False)
def request(
    ctx: StepContext,
    url: str,
    *,
    method: str = "GET",
    headers: Mapping[str, str] | None = None,
    params: Mapping[str, Any] | None = None,
    json: Any = None,
    body: str | bytes | None = None,
    timeout_s: float | None = None,
    max_bytes: int | None = None,
    expect_json: bool | None = None,
) -> dict[str, Any]:
    """Send one HTTP request through the egress policy and return its status, headers and body.

    Retryable: 5xx, 429, timeouts and transport errors. Anything else the caller must fix.

    ``max_bytes`` may lower the operator's response cap, never raise it: a profile's author
    must not be able to make a worker hold more than the deployment allows."""
    ctx.check_cancelled()
    if not isinstance(url, str):
        raise _fail("http.request: url must be a string", "bad_inputs", retryable=False)
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise _fail(f"invalid URL {url!r}: {exc}", "bad_url", retryable=False) from exc
    verb = method.upper() if isinstance(method, str) else ""
    if verb not in ALLOWED_METHODS:
        raise _fail(f"unsupported HTTP method {method!r}", "bad_inputs", retryable=False)
    if json is not None and body is not None:
        raise _fail("give either json or body, not both", "bad_inputs", retryable=False)
    policy = EgressPolicy.from_settings(ctx.settings, "http.request")
    timeout = _positive(timeout_s, "timeout_s") if timeout_s is not None else policy.timeout_s
    cap = policy.max_bytes
    if max_bytes is not None:
        cap = min(cap, int(_positive(max_bytes, "max_bytes")))
    deadline = time.monotonic() + timeout

    try:
        with (
            guarded_client(policy, timeout=timeout) as client,
            client.stream(
                verb,
                parsed,
                headers=dict(headers) if headers else None,
                params=dict(params) if params else None,
                json=json,
                content=body,
            ) as response,
        ):
            raw = _read_capped(ctx, response, cap, deadline, url)
    except httpx.TimeoutException as exc:
        raise _fail(f"{verb} {url} timed out: {exc}", "timeout", retryable=True) from exc
    except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
        raise _fail(f"{verb} {url} failed: {exc}", "bad_url", retryable=False) from exc
    except httpx.TransportError as exc:
        raise _fail(
            f"{verb} {url} failed: {type(exc).__name__}: {exc}",
            "transport",
            retryable=True,
            type=type(exc).__name__,
        ) from exc

    status = response.status_code
    if status >= 400:
        retryable = status >= 500 or status == 429
        raise _fail(
            f"{verb} {url} returned HTTP {status}",
            "http_status",
            retryable=retryable,
            status=status,
            retry_after=response.headers.get("retry-after"),
            body=_decode(raw, response)[:ERROR_SNIPPET_CHARS],
        )

    result: dict[str, Any] = {
        "status": status,
        "headers": {key.lower(): value for key, value in response.headers.items()},
    }
    text = _decode(raw, response)
    wants_json = (
        expect_json
        if expect_json is not None
        else _is_json_type(response.headers.get("content-type", ""))
    )
    if wants_json:
        try:
            result["json"] = jsonlib.loads(text) if text.strip() else None
        except ValueError as exc:
            if expect_json:
                raise _fail(
                    f"{verb} {url} did not return valid JSON: {exc}",
                    "bad_json",
                    retryable=False,
                    body=text[:ERROR_SNIPPET_CHARS],
                ) from exc
            result["text"] = text
    else:
        result["text"] = text
    return result
