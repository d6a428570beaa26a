"""``llm.chat`` and ``llm.embed`` against a local OpenAI-compatible server, real client code,
on the real Redis limiter."""

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from service.actions import REGISTRY, StepContext, load_plugins
from service.platform.errors import ActionError
from service.platform.metrics import registry
from tests.conftest import Stack
from tests.service.actions import make_ctx
from tests.support.llm_server import LlmServer, running

KEY_ENV = "FLOWBEAT_TEST_LLM_KEY"


@pytest.fixture(scope="module", autouse=True)
def _builtins() -> None:
    load_plugins(REGISTRY, [], entry_points=[])


@pytest.fixture
def llm(monkeypatch: pytest.MonkeyPatch) -> Iterator[LlmServer]:
    monkeypatch.setenv(KEY_ENV, "sk-test-123")
    yield from running()


def _ctx(server: LlmServer, **provider: Any) -> StepContext:
    spec = {
        "name": "local",
        "base_url": server.url,
        "api_key_env": KEY_ENV,
        "default_model": "gpt-4o-mini",
        "options": {"temperature": 0.2},
        **provider,
    }
    return make_ctx(llm_providers=[spec])


def chat(ctx: StepContext, **inputs: Any) -> Any:
    return REGISTRY.call("llm.chat", ctx, inputs)


def _tokens(kind: str) -> float:
    """Counted by the provider and the model the step asked for, not the provider's echo."""
    labels = {"provider": "local", "model": "gpt-4o-mini", "kind": kind}
    return registry().get_sample_value("flowbeat_llm_tokens_total", labels) or 0.0


def test_a_chat_renders_its_templates_and_reports_tokens_and_latency(
    stack: Stack, llm: LlmServer
) -> None:
    llm.answer("Two papers look relevant.")
    before = {kind: _tokens(kind) for kind in ("prompt", "completion")}
    out = chat(
        _ctx(llm),
        system="You triage papers about {{ vars.topic }}.",
        user="{% for p in vars.papers %}- {{ p.title }}\n{% endfor %}",
        vars={"topic": "sedation", "papers": [{"title": "A"}, {"title": "B"}]},
        options={"max_tokens": 50},
    )

    assert out["text"] == "Two papers look relevant."
    assert out["usage"] == {"prompt_tokens": 19, "completion_tokens": 10, "total_tokens": 29}
    assert {kind: _tokens(kind) - n for kind, n in before.items()} == {
        "prompt": 19,
        "completion": 10,
    }
    assert out["model"] == "gpt-4o-mini-2024-07-18" and out["provider"] == "local"
    assert out["latency_ms"] >= 0
    [seen] = llm.requests
    assert seen.path == "/v1/chat/completions"
    assert seen.headers["Authorization"] == "Bearer sk-test-123"
    assert seen.body["messages"] == [
        {"role": "system", "content": "You triage papers about sedation."},
        {"role": "user", "content": "- A\n- B\n"},
    ]
    assert (seen.body["model"], seen.body["temperature"], seen.body["max_tokens"]) == (
        "gpt-4o-mini",
        0.2,
        50,
    )


def test_a_step_overrides_the_providers_model_and_options(stack: Stack, llm: LlmServer) -> None:
    chat(_ctx(llm), user="hi", model="llama3.1", options={"temperature": 0.9})
    [seen] = llm.requests
    assert (seen.body["model"], seen.body["temperature"]) == ("llama3.1", 0.9)


@pytest.mark.parametrize(
    ("fmt", "answer", "expected"),
    [
        ("json_strict", '{"relevant": [1, 2]}', {"relevant": [1, 2]}),
        ("json_loose", 'Here you go:\n```json\n{"relevant": [3]}\n```', {"relevant": [3]}),
    ],
)
def test_json_answers_are_parsed_and_checked_against_the_schema(
    stack: Stack, llm: LlmServer, fmt: str, answer: str, expected: Any
) -> None:
    llm.answer(answer)
    schema = {"type": "object", "required": ["relevant"]}
    out = chat(_ctx(llm), user="pick", output_format=fmt, output_schema=schema)
    assert out["json"] == expected
    if fmt == "json_strict":
        assert llm.requests[0].body["response_format"] == {"type": "json_object"}


@pytest.mark.parametrize(
    "answer", ["not json at all", '{"other": true}'], ids=["unparsable", "off-schema"]
)
def test_a_strict_answer_that_does_not_fit_fails_the_attempt_as_retryable(
    stack: Stack, llm: LlmServer, answer: str
) -> None:
    llm.answer(answer)
    schema = {"type": "object", "required": ["relevant"]}
    with pytest.raises(ActionError) as info:
        chat(_ctx(llm), user="pick", output_format="json_strict", output_schema=schema)
    assert info.value.retryable is True
    assert info.value.details["reason"] == "output_invalid"


def test_a_429_is_waited_out_as_retry_after_says(stack: Stack, llm: LlmServer) -> None:
    llm.fail_next(1, 429, "rate-limited", retry_after="1")
    llm.answer("after the wait")
    started = time.monotonic()

    out = chat(_ctx(llm), user="hi")

    assert out["text"] == "after the wait"
    assert len(llm.requests) == 2
    assert time.monotonic() - started >= 0.9


def test_a_request_the_provider_refuses_is_not_retried_and_says_why(
    stack: Stack, llm: LlmServer
) -> None:
    llm.fail_next(1, 400, "invalid-request")
    with pytest.raises(ActionError) as info:
        chat(_ctx(llm), user="hi", options={"temperature": 9})
    assert info.value.retryable is False
    assert "expected a number between 0 and 2" in info.value.message
    assert len(llm.requests) == 1


def test_requests_of_a_provider_share_its_rate_limit(stack: Stack, llm: LlmServer) -> None:
    ctx = _ctx(llm, requests_per_minute=2, name=f"rl-{time.monotonic_ns()}", timeout_s=1)
    chat(ctx, user="1")
    chat(ctx, user="2")
    with pytest.raises(ActionError):
        chat(ctx, user="3")
    assert len(llm.requests) == 2


@pytest.mark.parametrize(
    ("inputs", "reason"),
    [
        ({"user": "{{ vars.missing }}"}, "template"),
        ({"user": "{{ ''.__class__.__mro__ }}"}, "template"),
        ({"user": "hi", "provider": "nope"}, "no_provider"),
        ({"user": "hi", "options": {"logit_bias": {}}}, "bad_inputs"),
        ({"user": "hi", "output_format": "yaml"}, "bad_inputs"),
    ],
)
def test_what_the_step_author_must_fix_fails_for_good(
    stack: Stack, llm: LlmServer, inputs: dict[str, Any], reason: str
) -> None:
    with pytest.raises(ActionError) as info:
        chat(_ctx(llm), **inputs)
    assert (info.value.retryable, info.value.details["reason"]) == (False, reason)
    assert llm.requests == []


def test_an_unset_key_is_named_without_sending_anything(
    stack: Stack, llm: LlmServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(ActionError) as info:
        chat(_ctx(llm), user="hi")
    assert info.value.details["reason"] == "no_api_key" and KEY_ENV in info.value.message
    assert llm.requests == []


def test_azure_takes_its_key_header_deployment_path_and_api_version(
    stack: Stack, llm: LlmServer
) -> None:
    base = llm.url.removesuffix("/v1")
    chat(_ctx(llm, kind="azure", base_url=base, api_version="2024-06-01"), user="hi")
    [seen] = llm.requests
    assert seen.path == "/openai/deployments/gpt-4o-mini/chat/completions"
    assert seen.query == "api-version=2024-06-01"
    assert seen.headers["api-key"] == "sk-test-123"


def test_embeddings_come_back_in_input_order(stack: Stack, llm: LlmServer) -> None:
    out = REGISTRY.call(
        "llm.embed", _ctx(llm, embedding_model="text-embedding-3-small"), {"texts": ["a", "b"]}
    )
    assert out["embeddings"][0] == [-0.006929283, -0.005336422, 0.012341]
    assert out["usage"]["prompt_tokens"] == 8
    assert json.loads(json.dumps(llm.requests[0].body)) == {
        "model": "text-embedding-3-small",
        "input": ["a", "b"],
    }
