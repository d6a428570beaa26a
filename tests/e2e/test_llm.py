"""The shipped LLM triage on real workers against a local OpenAI-compatible server."""

import json
from collections.abc import Iterator

import pytest

from tests.e2e.conftest import Client, Cluster
from tests.support.llm_server import LlmServer, running

VERDICT = '{"relevant": true, "reason": "It studies sedation in intensive care."}'


@pytest.fixture
def llm() -> Iterator[LlmServer]:
    yield from running()


@pytest.mark.timeout(120)
def test_papers_triage_asks_again_for_an_answer_off_its_schema(
    client: Client, cluster: Cluster, llm: LlmServer
) -> None:
    provider = {"name": "local", "kind": "vllm", "base_url": llm.url, "default_model": "qwen"}
    cluster.worker(llm_providers=json.dumps([provider]))
    llm.answer("Sure! The paper is relevant.", *[VERDICT] * 100)

    job_id = client.submit("papers-triage", topic="sedation", since_year=2022)
    job = client.wait_final(job_id, timeout_s=90)

    assert job.job.status == "succeeded", job.job.error
    verdicts = job.job.result["triage"]
    assert verdicts and all(v["json"]["relevant"] is True for v in verdicts)
    assert {v["provider"] for v in verdicts} == {"local"}
    asked = [r.body for r in llm.requests]
    assert len(asked) == len(verdicts) + 1
    assert "sedation" in asked[0]["messages"][0]["content"]
