"""The shipped literature and data refresh profiles run on a real worker against local servers.

The profiles are submitted inline without their ``schedule`` block, which this branch's profile
model does not know yet; everything else is the shipped file.
"""

import hashlib
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from tests.conftest import Stack
from tests.e2e.conftest import Client, Cluster
from tests.support.replay import ReplayServer

PROFILES = Path(__file__).resolve().parents[2] / "profiles"
CSV = b"id,name,value\n1,alpha,10\n2,beta,\n3,gamma,30\n"


def shipped(name: str) -> dict[str, Any]:
    data = yaml.safe_load((PROFILES / f"{name}.yaml").read_text())
    data.pop("schedule")
    return dict(data)


class CsvHandler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return None

    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/items.csv" else 404)
        self.send_header("Content-Length", str(len(CSV)))
        self.end_headers()
        self.wfile.write(CSV)


@pytest.fixture
def replay() -> Iterator[ReplayServer]:
    server = ReplayServer().start()
    yield server
    server.stop()


@pytest.fixture
def csv_url() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), CsvHandler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/items.csv"
    httpd.shutdown()
    httpd.server_close()


def test_the_weekly_remimazolam_search_finds_its_papers_through_the_rate_limit(
    cluster: Cluster, client: Client, replay: ReplayServer
) -> None:
    cluster.worker(pubmed_base_url=f"{replay.url}/eutils", ncbi_api_key="test-key")
    replay.fail_next(1, status=429, retry_after="1")

    view = client.wait_final(client.submit(shipped("remimazolam-icu-sedation")))

    assert view.job.status == "succeeded", view.job.error
    assert view.job.result["key"] == "pmid"
    papers = view.job.result["items"]
    assert [p["pmid"] for p in papers][:2] == ["39412876", "39087452"]
    assert len(papers) == 6
    assert all(p["title"] and p["journal"] and p["doi"] for p in papers)
    searches = replay.seen("/esearch.fcgi")
    assert len(searches) == 2
    assert searches[-1].params["api_key"] == "test-key"
    assert "remimazolam" in searches[-1].params["term"]
    assert len(replay.seen("/esummary.fcgi")) == 1


def test_the_monthly_crispr_search_merges_both_sources_without_duplicates(
    cluster: Cluster, client: Client, replay: ReplayServer
) -> None:
    cluster.worker(
        pubmed_base_url=f"{replay.url}/eutils", europepmc_base_url=f"{replay.url}/europepmc"
    )

    view = client.wait_final(client.submit(shipped("crispr-gene-therapy")))

    assert view.job.status == "succeeded", view.job.error
    pmids = [p["pmid"] for p in view.job.result["items"]]
    assert len(pmids) == len(set(pmids)) == 8
    assert {"39950412", "39877120"} <= set(pmids)
    gene_therapy = next(p for p in view.job.result["items"] if p["pmid"] == "39821345")
    assert gene_therapy["journal"] == "The New England journal of medicine"


def test_a_data_refresh_downloads_parses_and_upserts_twice(
    cluster: Cluster, client: Client, stack: Stack, csv_url: str, tmp_path: Path
) -> None:
    table = f"items_{uuid.uuid4().hex[:8]}"
    url = stack.database_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url) as conn:
        conn.execute(f"CREATE TABLE datasets.{table} (id int PRIMARY KEY, name text, value int)")
    cluster.worker(data_dir=str(tmp_path))
    params = {"url": csv_url, "sha256": hashlib.sha256(CSV).hexdigest(), "table": table}

    first = client.wait_final(client.submit(shipped("data-refresh"), **params))
    second = client.wait_final(client.submit(shipped("data-refresh"), **params))

    assert first.job.status == second.job.status == "succeeded", first.job.error
    assert client.steps(first.job.id)["upsert"].status == "succeeded"
    with psycopg.connect(url) as conn:
        rows = conn.execute(f"SELECT id, name, value FROM datasets.{table} ORDER BY id").fetchall()
        conn.execute(f"DROP TABLE datasets.{table}")
    assert rows == [(1, "alpha", 10), (2, "beta", None), (3, "gamma", 30)]
