"""``llm.chat`` and ``llm.embed`` on OpenAI-compatible endpoints (OpenAI, Azure, vLLM, Ollama).

Providers are settings (``FLOWBEAT_LLM_PROVIDERS``); a step names one and may override its
model and options, which override the provider's defaults. Prompts are
Jinja2 templates rendered in the sandboxed environment, so a template can read what it is
given (``vars``, ``params``) and nothing else: no attribute of a Python object outside the
sandbox's allow-list, no import, no call into the worker. Requests of one provider share one
rate limit across every worker (``service.platform.ratelimit``), go out through the egress
policy, and are tried again within the attempt on 429 (after its ``Retry-After``), 5xx and transport
errors; a 4xx is the step author's to fix and is not retried. ``json_strict`` output that does
not parse or fit ``output_schema`` fails the attempt as retryable: a model may answer better
the next time.
"""

import json
import os
import time
from collections.abc import Mapping
from typing import Any

import httpx
import jsonschema
import redis
from jinja2 import StrictUndefined, TemplateError
from jinja2.sandbox import SandboxedEnvironment

from service.actions.context import StepContext
from service.actions.registry import action
from service.actions.scholarly import retry_after_s
from service.platform.constants import LLM_HTTP_ATTEMPTS
from service.platform.egress import EgressPolicy, guarded_client
from service.platform.errors import ActionError
from service.platform.metrics import LLM_REQUEST_SECONDS, LLM_TOKENS
from service.platform.ratelimit import RateLimiter, redis_client
from service.platform.settings import LlmProvider

OPTION_NAMES = frozenset(
    {"temperature", "top_p", "max_tokens", "stop", "seed", "presence_penalty", "frequency_penalty"}
)
OUTPUT_FORMATS = frozenset({"text", "json_strict", "json_loose"})
_TEMPLATES = SandboxedEnvironment(undefined=StrictUndefined, autoescape=False)
BACKOFF_BASE_S = 1.0


def _fail(message: str, reason: str, *, retryable: bool, **details: Any) -> ActionError:
    return ActionError(message, {"reason": reason, **details}, retryable=retryable)


def provider_of(ctx: StepContext, name: str | None) -> LlmProvider:
    providers = ctx.settings.llm_providers
    if not providers:
        raise _fail(
            "no LLM provider is configured (FLOWBEAT_LLM_PROVIDERS)", "no_provider", retryable=False
        )
    if name is None:
        return providers[0]
    for provider in providers:
        if provider.name == name:
            return provider
    known = [p.name for p in providers]
    raise _fail(f"no LLM provider {name!r}", "no_provider", retryable=False, known=known)


def render(template: str, values: Mapping[str, Any], field: str) -> str:
    try:
        return _TEMPLATES.from_string(template).render(**values)
    except TemplateError as exc:
        raise _fail(
            f"llm: the {field} template failed: {exc}", "template", retryable=False, field=field
        ) from None


def _headers(provider: LlmProvider) -> dict[str, str]:
    if provider.api_key_env is None:
        return {}
    key = os.environ.get(provider.api_key_env)
    if not key:
        raise _fail(
            f"provider {provider.name!r} reads its key from ${provider.api_key_env}: unset",
            "no_api_key",
            retryable=False,
        )
    if provider.kind == "azure":
        return {"api-key": key}
    return {"Authorization": f"Bearer {key}"}


def _url(provider: LlmProvider, model: str, path: str) -> tuple[str, dict[str, str]]:
    base = provider.base_url.rstrip("/")
    if provider.kind == "azure":
        return f"{base}/openai/deployments/{model}/{path}", {
            "api-version": provider.api_version or "2024-06-01"
        }
    return f"{base}/{path}", {}


def _limiter(ctx: StepContext, provider: LlmProvider) -> RateLimiter | None:
    if provider.requests_per_minute <= 0:
        return None
    client = redis_client(ctx.settings.broker())
    return RateLimiter(f"llm:{provider.name}", provider.requests_per_minute, 60.0, client=client)


def _take_slot(ctx: StepContext, limiter: RateLimiter, provider: LlmProvider) -> None:
    """Wait for the provider's rate limit, up to its timeout; then the attempt fails, retryable."""
    try:
        limiter.acquire(sleep=ctx.sleep, timeout_s=provider.timeout_s)
    except TimeoutError as exc:
        raise _fail(f"llm: {exc}", "rate_limited", retryable=True) from None
    except redis.RedisError as exc:
        raise _fail(
            f"llm: the rate limit in Redis is unavailable: {exc}", "rate_limit", retryable=True
        ) from None


def _post(ctx: StepContext, provider: LlmProvider, model: str, path: str, body: Any) -> Any:
    """POST with the provider's limit, retries and egress policy; the decoded JSON answer."""
    url, query = _url(provider, model, path)
    headers = _headers(provider)
    policy = EgressPolicy.from_settings(ctx.settings, "llm")
    limiter = _limiter(ctx, provider)
    failure: ActionError | None = None
    with guarded_client(policy, timeout=provider.timeout_s, follow_redirects=False) as client:
        for attempt in range(1, LLM_HTTP_ATTEMPTS + 1):
            ctx.check_cancelled()
            if limiter is not None:
                _take_slot(ctx, limiter, provider)
            backoff = BACKOFF_BASE_S * 2 ** (attempt - 1)
            try:
                response = client.post(url, params=query, json=body, headers=headers)
            except httpx.TransportError as exc:
                failure = _fail(
                    f"llm: POST {url} failed: {type(exc).__name__}: {exc}",
                    "transport",
                    retryable=True,
                    attempts=attempt,
                )
                if attempt < LLM_HTTP_ATTEMPTS:
                    ctx.sleep(backoff)
                continue
            status = response.status_code
            if status == 429 or status >= 500:
                failure = _fail(
                    f"llm: {provider.name} answered HTTP {status}",
                    "http_status",
                    retryable=True,
                    status=status,
                    attempts=attempt,
                )
                if attempt < LLM_HTTP_ATTEMPTS:
                    ctx.sleep(retry_after_s(response.headers.get("retry-after"), backoff))
                continue
            if status >= 400:
                raise _fail(
                    f"llm: {provider.name} refused the request: HTTP {status}: "
                    f"{_provider_message(response)}",
                    "http_status",
                    retryable=False,
                    status=status,
                )
            try:
                return response.json()
            except ValueError:
                raise _fail(
                    f"llm: {provider.name} answered with something not JSON",
                    "bad_json",
                    retryable=True,
                ) from None
    assert failure is not None
    raise failure


def _provider_message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error", {})
        return str(error.get("message", ""))[:500] if isinstance(error, dict) else str(error)[:500]
    except (ValueError, AttributeError):
        return response.text[:500]


def _first_json(text: str) -> Any:
    """The first JSON object or array in ``text``, e.g. inside a fenced code block."""
    decoder = json.JSONDecoder()
    for start, char in enumerate(text):
        if char in "{[":
            try:
                value, _ = decoder.raw_decode(text[start:])
            except ValueError:
                continue
            return value
    raise ValueError("no JSON object or array in the answer")


def parse_output(text: str, output_format: str, schema: Mapping[str, Any] | None) -> Any:
    if output_format == "text":
        return None
    try:
        value = json.loads(text) if output_format == "json_strict" else _first_json(text)
    except ValueError as exc:
        raise _fail(
            f"llm: the answer is not the JSON asked for: {exc}",
            "output_invalid",
            retryable=True,
            answer=text[:500],
        ) from None
    if schema is not None:
        problems = sorted(jsonschema.Draft202012Validator(schema).iter_errors(value), key=str)
        if problems:
            first = problems[0]
            raise _fail(
                f"llm: the answer does not fit output_schema: {first.message}",
                "output_invalid",
                retryable=True,
                path=[str(p) for p in first.absolute_path],
                answer=text[:500],
            )
    return value


def _options(provider: LlmProvider, given: Mapping[str, Any] | None) -> dict[str, Any]:
    merged = {**provider.options, **(given or {})}
    unknown = sorted(set(merged) - OPTION_NAMES)
    if unknown:
        raise _fail(
            f"llm: unknown options {unknown}",
            "bad_inputs",
            retryable=False,
            allowed=sorted(OPTION_NAMES),
        )
    return merged


@action("llm.chat", cache=False)
def chat(
    ctx: StepContext,
    user: str,
    *,
    system: str | None = None,
    vars: Mapping[str, Any] | None = None,
    provider: str | None = None,
    model: str | None = None,
    options: Mapping[str, Any] | None = None,
    output_format: str = "text",
    output_schema: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One chat completion. Returns ``text``, ``json`` (for the JSON formats), ``model``,
    ``provider``, ``usage`` (token counts) and ``latency_ms``."""
    if output_format not in OUTPUT_FORMATS:
        raise _fail(
            f"llm.chat: output_format must be one of {sorted(OUTPUT_FORMATS)}",
            "bad_inputs",
            retryable=False,
        )
    if output_schema is not None:
        try:
            jsonschema.Draft202012Validator.check_schema(output_schema)
        except jsonschema.SchemaError as exc:
            raise _fail(
                f"llm.chat: output_schema is not a JSON Schema: {exc.message}",
                "bad_inputs",
                retryable=False,
            ) from None
    chosen = provider_of(ctx, provider)
    values = {"vars": dict(vars or {}), "params": dict(ctx.params)}
    messages = []
    if system is not None:
        messages.append({"role": "system", "content": render(system, values, "system")})
    messages.append({"role": "user", "content": render(user, values, "user")})
    body: dict[str, Any] = {
        "model": model or chosen.default_model,
        "messages": messages,
        **_options(chosen, options),
    }
    if output_format == "json_strict":
        body["response_format"] = {"type": "json_object"}
    started = time.monotonic()
    answer = _post(ctx, chosen, body["model"], "chat/completions", body)
    latency_ms = round((time.monotonic() - started) * 1000, 1)
    try:
        text = answer["choices"][0]["message"]["content"] or ""
    except (KeyError, IndexError, TypeError):
        raise _fail(
            "llm.chat: the answer has no choices[0].message.content", "bad_answer", retryable=True
        ) from None
    out: dict[str, Any] = {
        "text": text,
        "model": answer.get("model", body["model"]),
        "provider": chosen.name,
        "usage": _usage(chosen.name, body["model"], answer),
        "latency_ms": latency_ms,
    }
    LLM_REQUEST_SECONDS.labels(chosen.name, body["model"]).observe(latency_ms / 1000)
    if output_format != "text":
        out["json"] = parse_output(text, output_format, output_schema)
    return out


def _usage(provider: str, model: str, answer: Mapping[str, Any]) -> dict[str, int]:
    """The answer's token counts, also counted by provider and the model the step asked for
    (a configured name, not the provider's echo of it, so label values stay few)."""
    usage = answer.get("usage") or {}
    counts = {
        name: int(usage.get(name, 0) or 0)
        for name in ("prompt_tokens", "completion_tokens", "total_tokens")
    }
    for kind in ("prompt", "completion"):
        LLM_TOKENS.labels(provider, model, kind).inc(counts[f"{kind}_tokens"])
    return counts


@action("llm.embed", cache=False)
def embed(
    ctx: StepContext,
    texts: list[str],
    *,
    provider: str | None = None,
    model: str | None = None,
) -> dict[str, Any]:
    """Embeddings of ``texts``, in order: ``embeddings``, ``model``, ``usage``."""
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise _fail("llm.embed: texts must be a list of strings", "bad_inputs", retryable=False)
    chosen = provider_of(ctx, provider)
    name = model or chosen.embedding_model or chosen.default_model
    answer = _post(ctx, chosen, name, "embeddings", {"model": name, "input": texts})
    try:
        rows = sorted(answer["data"], key=lambda row: row["index"])
        vectors = [row["embedding"] for row in rows]
    except (KeyError, TypeError):
        raise _fail(
            "llm.embed: the answer has no data[].embedding", "bad_answer", retryable=True
        ) from None
    usage = _usage(chosen.name, name, answer)
    return {"embeddings": vectors, "model": answer.get("model", name), "usage": usage}
