"""``europepmc.search`` against the replay server: lite results, cursor paging, retries."""

from collections.abc import Iterator
from typing import Any

import pytest

from service.actions import REGISTRY, StepContext, load_plugins
from service.platform.errors import ActionError
from tests.conftest import Stack
from tests.service.actions import make_ctx
from tests.support.replay import ReplayServer

QUERY = 'CRISPR AND "gene therapy" AND SRC:MED'


@pytest.fixture(scope="module", autouse=True)
def _builtins() -> None:
    load_plugins(REGISTRY, [], entry_points=[])


@pytest.fixture
def replay() -> Iterator[ReplayServer]:
    server = ReplayServer().start()
    yield server
    server.stop()


def search(replay: ReplayServer, **inputs: Any) -> Any:
    ctx: StepContext = make_ctx(europepmc_base_url=f"{replay.url}/europepmc")
    return REGISTRY.call("europepmc.search", ctx, inputs)


def test_pages_follow_the_cursor_until_the_results_end(stack: Stack, replay: ReplayServer) -> None:
    items = search(replay, query=QUERY)
    assert [item["pmid"] for item in items] == [
        "39821345",
        "39702281",
        "39950412",
        "39412003",
        "39877120",
    ]
    cursors = [seen.params["cursorMark"] for seen in replay.seen("/search")]
    assert cursors == ["*", "AoIIP/1Ofig0MzAxNDU5Mg==", "AoIIP/1Ofig0Mzk4NzcxMjA="]
    first = replay.seen("/search")[0].params
    assert (first["format"], first["resultType"]) == ("json", "lite")


def test_items_carry_id_pmid_doi_journal_and_authors(stack: Stack, replay: ReplayServer) -> None:
    item = search(replay, query=QUERY)[0]
    assert item["id"] == item["pmid"] == "39821345"
    assert item["source"] == "MED"
    assert item["doi"] == "10.1056/NEJMoa2309673"
    assert item["journal"] == "N Engl J Med"
    assert item["authors"] == ["Locatelli F", "Lang P", "Wall D"]


def test_paging_stops_at_the_limit(stack: Stack, replay: ReplayServer) -> None:
    items = search(replay, query=QUERY, limit=2)
    assert len(items) == 2
    [seen] = replay.seen("/search")
    assert seen.params["pageSize"] == "2"


def test_a_429_then_success_is_retried(stack: Stack, replay: ReplayServer) -> None:
    replay.fail_next(1, status=429, retry_after="0")
    assert len(search(replay, query=QUERY)) == 5
    assert len(replay.seen("/search")) == 4


@pytest.mark.parametrize("inputs", [{"query": " "}, {"query": "x", "limit": 0}])
def test_bad_inputs_are_refused(stack: Stack, replay: ReplayServer, inputs: dict[str, Any]) -> None:
    with pytest.raises(ActionError) as info:
        search(replay, **inputs)
    assert info.value.retryable is False
    assert replay.requests == []
