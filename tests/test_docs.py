"""The README stays short and points at pages that exist; the docs site's reference pages are
what ``scripts/gen_reference.py`` writes from the code today; every page is in the nav; and the
pages ``make chaos FULL=1`` and ``make cluster`` write into keep their markers. ``make docs``
builds the site itself, with ``mkdocs build --strict``."""

import re
from pathlib import Path

import pytest

from scripts import gen_reference
from service.platform.settings import Settings
from tests.chaos.report import BEGIN, END, line, table
from tests.cluster import results as cluster_results
from tests.test_readme import documents

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README_MAX_LINES = 400
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_is_at_most_400_lines() -> None:
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= README_MAX_LINES


def test_every_relative_link_of_the_readme_reaches_a_file() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = [t for t in LINK.findall(text) if "://" not in t]
    assert targets
    assert [t for t in targets if not (ROOT / t).exists()] == []


def test_every_docs_page_is_in_the_nav() -> None:
    in_nav = {path.relative_to(DOCS) for path in documents()[1:]}
    on_disk = {path.relative_to(DOCS) for path in DOCS.rglob("*.md")}
    assert on_disk == in_nav


@pytest.mark.parametrize("name", sorted(gen_reference.PAGES))
def test_the_reference_page_is_what_the_code_gives(name: str) -> None:
    written = (DOCS / "reference" / name).read_text(encoding="utf-8")
    assert written == gen_reference.PAGES[name](), f"run make docs: {name} is stale"


def test_the_settings_reference_names_every_setting() -> None:
    page = (DOCS / "reference" / "settings.md").read_text(encoding="utf-8")
    assert [f for f in Settings.model_fields if f"`FLOWBEAT_{f.upper()}`" not in page] == []


def test_the_faults_survived_table_has_its_markers() -> None:
    page = (DOCS / "guarantees.md").read_text(encoding="utf-8")
    assert page.index(BEGIN) < page.index(END)


def test_a_chaos_run_of_some_scenarios_updates_their_rows_and_keeps_the_others() -> None:
    page = (DOCS / "guarantees.md").read_text(encoding="utf-8")
    standing = page[page.index(BEGIN) + len(BEGIN) : page.index(END)].strip()
    kept = standing.splitlines()[2:]
    first = kept[0].split("|")[1].strip()
    rerun = {"scenario": first, "faults": "again", "jobs": 1, "lost": 0, "doubled": 0}
    rerun |= {"reruns": 0, "recovery_p50_s": 1.0, "recovery_p99_s": 2.0, "scale": "full"}
    new = {**rerun, "scenario": "a scenario added since"}

    lines = table([rerun, new], standing).splitlines()[2:]

    assert len(lines) == len(kept) + 1
    assert lines[0] == line(rerun)
    assert lines[1:-1] == kept[1:]
    assert lines[-1] == line(new)


def test_a_cluster_run_of_some_scenarios_updates_their_rows_and_keeps_the_others() -> None:
    page = (DOCS / "cluster-drills.md").read_text(encoding="utf-8")
    begin, end = cluster_results.BEGIN, cluster_results.END
    standing = page[page.index(begin) + len(begin) : page.index(end)].strip()
    kept = standing.splitlines()[2:]
    row = {"scenario": "a scenario", "fault": "a cut", "jobs": 6, "lost": 0, "doubled": 0}
    row |= {"reruns": 1, "recovery_p50_s": 4.1, "recovery_max_s": 4.3, "took_s": 17.6}

    lines = cluster_results.table([row], standing).splitlines()

    assert lines[2:] == [*kept, cluster_results.line(row)]
    assert cluster_results.line(row).endswith("| 4.1 s / 4.3 s | 17.6 s |")
