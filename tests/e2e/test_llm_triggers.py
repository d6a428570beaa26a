"""The papers-triage-new of the LLM guide (docs/guides/llm.md), saved as a reader would,
triages exactly the papers each run of the shipped weekly literature search newly found, on real
workers and beat, against a replayed PubMed and a local OpenAI-compatible server."""

import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select

from service.catalogue.saving import save_pipeline
from service.engine.submission import JobRequest, submit_job
from service.language.plan import load_plan
from service.platform.db import unit_of_work
from service.platform.models import JobRow
from tasks.dispatch import publish_new_job
from tests.e2e.conftest import ROOT, Client, Cluster, wait_for
from tests.e2e.test_literature import shipped
from tests.support.llm_server import LlmServer, running
from tests.support.replay import ReplayServer

LITERATURE = "remimazolam-icu-sedation"
VERDICT = '{"relevant": true, "reason": "It compares remimazolam with propofol in the ICU."}'
OFF_SCHEMA = '{"relevant": "probably", "reason": "It is about sedation."}'


def readme_triage_pipeline() -> str:
    guide = (ROOT / "docs" / "guides" / "llm.md").read_text()
    [block] = re.findall(r"```yaml\n(name: papers-triage-new\n.*?)```", guide, re.DOTALL)
    return str(block)


@pytest.fixture
def llm() -> Iterator[LlmServer]:
    yield from running()


@pytest.fixture
def pubmed() -> Iterator[ReplayServer]:
    server = ReplayServer().start()
    yield server
    server.stop()


def _weekly_search(pubmed: ReplayServer) -> dict[str, Any]:
    """The recorded answer of PubMed's search for the weekly profile's query."""
    [recording] = [
        r for r in pubmed.recordings if "remimazolam" in r["request"]["params"].get("term", "")
    ]
    found: dict[str, Any] = recording["response"]["body"]["esearchresult"]
    return found


def _indexed(pubmed: ReplayServer, pmids: list[str]) -> None:
    """PubMed's search for the weekly profile answers these PMIDs from now on."""
    _weekly_search(pubmed).update(idlist=pmids, count=str(len(pmids)), retmax=str(len(pmids)))


def _run_literature(client: Client, owner: str) -> JobRow:
    rt = client.rt
    with unit_of_work(rt.sessions) as session:
        job, _ = submit_job(
            session,
            JobRequest(pipeline=shipped(LITERATURE), params={}),
            owner=owner,
            profiles_dir=rt.settings.profiles_dir,
            known_actions=rt.registry.names(),
        )
        plan = load_plan(session, job.id)
    assert plan is not None
    publish_new_job(client.app, rt, plan)
    view = client.wait_final(job.id, timeout_s=60)
    assert view.job.status == "succeeded", view.job.error
    with unit_of_work(rt.sessions) as session:
        stored = session.get(JobRow, job.id)
        assert stored is not None
        return stored


def _triage_jobs(client: Client, owner: str) -> list[JobRow]:
    with unit_of_work(client.rt.sessions) as session:
        return list(
            session.scalars(
                select(JobRow)
                .where(JobRow.owner == owner, JobRow.pipeline == "papers-triage-new")
                .order_by(JobRow.created_at)
            )
        )


def _asked(llm: LlmServer) -> list[str]:
    return [r.body["messages"][1]["content"] for r in llm.requests]


@pytest.mark.timeout(180)
def test_the_readme_triage_runs_once_per_literature_run_with_new_papers_over_just_those(
    client: Client, cluster: Cluster, llm: LlmServer, pubmed: ReplayServer
) -> None:
    owner = f"triage-{uuid.uuid4().hex[:8]}"
    provider = {"name": "local", "kind": "vllm", "base_url": llm.url, "default_model": "qwen"}
    cluster.worker(pubmed_base_url=f"{pubmed.url}/eutils", llm_providers=json.dumps([provider]))
    cluster.beat(beat_lock_ttl_s="1.5")
    with unit_of_work(client.rt.sessions) as session:
        save_pipeline(
            session,
            owner=owner,
            name=None,
            body=readme_triage_pipeline(),
            settings=client.rt.settings,
            known_actions=client.rt.registry.names(),
        )
    everything = list(_weekly_search(pubmed)["idlist"])
    newest, *older = everything
    llm.answer(OFF_SCHEMA, *[VERDICT] * 20)

    _indexed(pubmed, older)
    first = _run_literature(client, owner)
    [triaged] = wait_for(lambda: _triage_jobs(client, owner), 30, "the first run's triage job")
    client.wait_final(triaged.id, timeout_s=60)
    again = _run_literature(client, owner)
    _indexed(pubmed, everything)
    third = _run_literature(client, owner)
    wait_for(lambda: len(_triage_jobs(client, owner)) == 2, 30, "the third run's triage job")

    assert (first.new_count, again.new_count, third.new_count) == (len(older), 0, 1)
    jobs = [client.wait_final(job.id, timeout_s=60).job for job in _triage_jobs(client, owner)]
    assert [(job.trigger, job.parent_job_id) for job in jobs] == [
        ("dependency", first.id),
        ("dependency", third.id),
    ]
    assert all(job.status == "succeeded" for job in jobs), [job.error for job in jobs]
    papers = {
        p["pmid"]: f"{p['title']} ({p['journal']}, {p['pubdate']})" for p in third.result["items"]
    }
    verdicts = [job.result["triage"] for job in jobs]
    assert [len(v) for v in verdicts] == [len(older), 1]
    assert all(v["json"] == json.loads(VERDICT) for run in verdicts for v in run)
    asked = _asked(llm)
    assert len(asked) == len(everything) + 1
    assert sorted(set(asked[: len(older) + 1])) == sorted(papers[p] for p in older)
    assert asked[len(older) + 1 :] == [papers[newest]]
