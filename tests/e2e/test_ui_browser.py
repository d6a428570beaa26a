"""The dashboard in a real browser (Debian's Chromium, driven by Playwright) against a live API
and a real worker: a job fails at a step, a person logs in, finds it, reruns it from the failed
step, and watches the new job succeed through the page's live updates, its graph and
timeline drawn from what ran.

With ``FLOWBEAT_SCREENSHOTS=DIR`` the test also saves the docs' screenshots there
(``docs/screenshots``).
"""

import os
import uuid
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from tests.e2e.conftest import Client, Cluster, needs_chromium, wait_for

HOLD_S = 2.0
"""How long the publish step runs: the rerun page opens while it runs, so only the page's
live updates can show it succeed."""
BUSY_S = 120.0
"""How long the home page's running job holds its worker: past the end of the test, which
cancels it."""
pytestmark = needs_chromium


def _write_key(client: Client, owner: str = "tests") -> str:
    from service.platform.auth import create_api_key
    from service.platform.db import unit_of_work

    with unit_of_work(client.rt.sessions) as session:
        key, _ = create_api_key(session, owner=owner, scopes=["write"])
    return key


def _shot(page: Page, name: str) -> None:
    target = os.environ.get("FLOWBEAT_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(target) / f"{name}.png"), full_page=True)


@pytest.mark.timeout(180)
def test_a_failed_job_is_rerun_from_its_failed_step_and_succeeds(
    client: Client, cluster: Cluster, browser: Browser
) -> None:
    gate = f"publish-{uuid.uuid4().hex[:8]}"
    client.counters.set(f"drill:gate:{gate}", "closed", ex=600)
    base = cluster.api()
    cluster.worker()
    failed = client.submit("gated", gate=gate, hold_s=HOLD_S)
    assert client.wait_final(failed).job.status == "failed"

    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.goto(f"{base}/ui/jobs")
    page.fill("input[name=key]", _write_key(client))
    page.click("button[type=submit]")
    page.select_option("select[name=status]", "failed")
    page.click("text=Filter")
    _shot(page, "jobs")
    page.click(f"a[href='/ui/jobs/{failed}']")
    expect(page.locator("#step-publish")).to_have_attribute("data-status", "failed")
    expect(page.locator("#step-fetch")).to_have_attribute("data-status", "succeeded")
    expect(page.locator("#step-publish .error")).to_contain_text("the gate is closed")
    _shot(page, "job-failed")

    client.counters.delete(f"drill:gate:{gate}")
    page.click("#step-publish button:has-text('Rerun from here')")

    page.wait_for_url(lambda url: str(failed) not in url and "/ui/jobs/" in url)
    assert page.inner_text("#job-status") in {"queued", "running"}
    expect(page.locator("#step-publish")).to_have_attribute("data-status", "running")
    expect(page.locator("#job-status")).to_have_text("succeeded", timeout=60_000)
    expect(page.locator("#step-fetch")).to_have_attribute("data-status", "reused")
    expect(page.locator("#step-publish")).to_have_attribute("data-status", "succeeded")
    expect(page.locator("#graph path.edge")).to_have_count(1)
    expect(page.locator("#graph a.node[data-step=publish]")).to_have_attribute(
        "data-status", "succeeded"
    )
    expect(page.locator("#timeline .lane[data-step=publish] rect.bar.run")).to_have_count(1)
    expect(page.locator("#timeline .lane[data-step=fetch] rect.bar.run")).to_have_count(0)
    rerun = uuid.UUID(page.url.rstrip("/").rsplit("/", 1)[1])
    assert client.count(rerun, "fetch", "started") == 0
    assert client.wait_final(rerun).job.status == "succeeded"
    _shot(page, "job-rerun")
    page.goto(f"{base}/ui/pipelines/gated")
    _shot(page, "pipeline")


def _listed(base: str, key: str, **query: str) -> int:
    """How many jobs ``GET /v1/jobs`` lists for the key, as a client of the API counts them."""
    answer = httpx.get(
        f"{base}/v1/jobs",
        params={"limit": "200", **query},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert answer.status_code == 200, answer.text
    return len(answer.json()["jobs"])


def _figure(page: Page, name: str) -> int:
    return int(page.get_attribute(f"#fig-{name}", "data-count") or -1)


@pytest.mark.timeout(180)
def test_the_home_page_shows_what_the_api_lists_and_follows_new_jobs(
    client: Client, cluster: Cluster, browser: Browser
) -> None:
    owner, gate = f"home-{uuid.uuid4().hex[:6]}", f"home-{uuid.uuid4().hex[:8]}"
    base = cluster.api()
    cluster.worker()
    settled = [client.submit_at(None, "gated", owner=owner, gate="open") for _ in range(3)]
    client.counters.set(f"drill:gate:{gate}", "closed", ex=600)
    settled += [client.submit_at(None, "gated", owner=owner, gate=gate) for _ in range(2)]
    for job_id in settled:
        client.wait_final(job_id)
    busy = client.submit_at(None, "gated", owner=owner, gate="open", hold_s=BUSY_S)
    wait_for(lambda: client.steps(busy)["publish"].status == "running", 30, "the busy step")
    key = _write_key(client, owner)

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{base}/ui")
    page.fill("input[name=key]", key)
    page.click("button[type=submit]")

    page.wait_for_url(f"{base}/ui/home")
    shown = {name: _figure(page, name) for name in ("started", "succeeded", "failed", "running")}
    assert shown == {
        "started": _listed(base, key),
        "succeeded": _listed(base, key, status="succeeded"),
        "failed": _listed(base, key, status="failed"),
        "running": _listed(base, key, status="running"),
    }
    assert shown == {"started": 6, "succeeded": 3, "failed": 2, "running": 1}
    expect(page.locator("#failing tr[data-pipeline=gated] a.failed")).to_have_text("2")
    expect(page.locator(f"#workers a[href='/ui/jobs/{busy}#step-publish']")).to_have_count(1)

    client.wait_final(client.submit_at(None, "gated", owner=owner, gate="open"))
    expect(page.locator("#fig-started")).to_have_attribute("data-count", "7", timeout=20_000)
    expect(page.locator("#fig-succeeded")).to_have_attribute("data-count", "4")
    _shot(page, "home")

    page.click("#fig-failed")
    page.wait_for_url(lambda url: "/ui/jobs?" in url and "status=failed" in url)
    expect(page.locator("table.jobs tbody tr")).to_have_count(2)
    expect(page.locator("table.jobs .status.failed")).to_have_count(2)
    client.cancel(busy)


@pytest.mark.timeout(120)
def test_a_person_finds_an_action_and_its_inputs_in_the_catalogue(
    client: Client, cluster: Cluster, browser: Browser
) -> None:
    base = cluster.api()
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.goto(f"{base}/ui/jobs")
    page.fill("input[name=key]", _write_key(client))
    page.click("button[type=submit]")

    page.click("nav >> text=Actions")
    page.click("a[href='#pubmed.search']")

    action = page.locator("[id='pubmed.search']")
    expect(action).to_be_in_viewport()
    expect(action.locator("table.inputs tr", has_text="term")).to_contain_text("string")
    action.locator("summary", has_text="JSON Schema").click()
    expect(action.locator("details pre")).to_contain_text('"required": [\n    "term"\n  ]')
    expect(page.locator("[id='drill.count']")).to_contain_text("tests.drill_actions")
