"""``pubmed.search`` and ``pubmed.summary`` against the replay server, on the real Redis limiter."""

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from service.actions import REGISTRY, StepContext, load_plugins
from service.platform.errors import ActionError
from tests.conftest import Stack
from tests.service.actions import make_ctx
from tests.service.platform.test_ratelimit import assert_no_window_exceeds
from tests.support.replay import FIXTURES, ReplayServer

REMI = json.loads((FIXTURES / "eutils" / "esearch-remimazolam-icu-sedation.json").read_text())
REMI_TERM = REMI["request"]["params"]["term"]
REMI_IDS = REMI["response"]["body"]["esearchresult"]["idlist"]


@pytest.fixture(scope="module", autouse=True)
def _builtins() -> None:
    load_plugins(REGISTRY, [], entry_points=[])


@pytest.fixture
def replay() -> Iterator[ReplayServer]:
    server = ReplayServer().start()
    yield server
    server.stop()


def ctx_for(replay: ReplayServer, **settings: Any) -> StepContext:
    return make_ctx(pubmed_base_url=f"{replay.url}/eutils", **settings)


def call(ctx: StepContext, name: str, **inputs: Any) -> Any:
    return REGISTRY.call(name, ctx, inputs)


def test_search_returns_count_ids_and_the_query_translation(
    stack: Stack, replay: ReplayServer
) -> None:
    out = call(ctx_for(replay), "pubmed.search", term=REMI_TERM, retmax=50)
    assert out["count"] == len(REMI_IDS)
    assert out["ids"] == REMI_IDS
    assert "remimazolam" in out["query_translation"]
    [seen] = replay.seen("/esearch.fcgi")
    assert seen.params["db"] == "pubmed"
    assert seen.params["retmode"] == "json"
    assert seen.params["retmax"] == "50"
    assert seen.params["tool"] == "flowbeat"
    assert "api_key" not in seen.params


def test_the_api_key_and_email_from_settings_are_sent(stack: Stack, replay: ReplayServer) -> None:
    ctx = ctx_for(replay, ncbi_api_key="k3y", ncbi_email="lab@example.org", ncbi_tool="labtool")
    call(ctx, "pubmed.search", term=REMI_TERM)
    [seen] = replay.seen("/esearch.fcgi")
    assert seen.params["api_key"] == "k3y"
    assert seen.params["email"] == "lab@example.org"
    assert seen.params["tool"] == "labtool"


def test_a_date_range_is_sent_with_its_date_type(stack: Stack, replay: ReplayServer) -> None:
    call(
        ctx_for(replay),
        "pubmed.search",
        term=REMI_TERM,
        mindate="2023/01/01",
        maxdate="2024/12/31",
        datetype="edat",
        sort="pub_date",
    )
    [seen] = replay.seen("/esearch.fcgi")
    assert (seen.params["mindate"], seen.params["maxdate"]) == ("2023/01/01", "2024/12/31")
    assert (seen.params["datetype"], seen.params["sort"]) == ("edat", "pub_date")


def test_a_period_read_from_a_schedules_fire_times_is_sent_as_dates(
    stack: Stack, replay: ReplayServer
) -> None:
    call(
        ctx_for(replay),
        "pubmed.search",
        term=REMI_TERM,
        mindate="2026-04-27T08:00:00+00:00",
        maxdate="2026-05-04",
    )
    [seen] = replay.seen("/esearch.fcgi")
    assert (seen.params["mindate"], seen.params["maxdate"]) == ("2026/04/27", "2026/05/04")


@pytest.mark.parametrize(
    "inputs",
    [
        {"term": ""},
        {"term": "x", "retmax": 10_001},
        {"term": "x", "mindate": "2020"},
        {"term": "x", "datetype": "xdat"},
        {"term": "x", "sort": "random"},
    ],
)
def test_bad_inputs_are_refused_without_a_request(
    stack: Stack, replay: ReplayServer, inputs: dict[str, Any]
) -> None:
    with pytest.raises(ActionError) as info:
        call(ctx_for(replay), "pubmed.search", **inputs)
    assert info.value.retryable is False
    assert replay.requests == []


def test_a_429_is_retried_after_the_time_retry_after_asks(
    stack: Stack, replay: ReplayServer
) -> None:
    replay.fail_next(1, status=429, retry_after="1")
    replay.fail_next(1, status=503, retry_after="0")
    started = time.monotonic()
    out = call(ctx_for(replay), "pubmed.search", term=REMI_TERM)
    assert out["ids"] == REMI_IDS
    assert len(replay.seen("/esearch.fcgi")) == 3
    assert time.monotonic() - started >= 1.0


def test_a_server_that_keeps_failing_gives_a_retryable_error(
    stack: Stack, replay: ReplayServer
) -> None:
    replay.fail_next(10, status=503, retry_after="0")
    with pytest.raises(ActionError) as info:
        call(ctx_for(replay), "pubmed.search", term=REMI_TERM)
    assert info.value.retryable is True
    assert info.value.details["status"] == 503
    assert len(replay.seen("/esearch.fcgi")) == 4


def test_a_client_error_is_not_retried(stack: Stack, replay: ReplayServer) -> None:
    with pytest.raises(ActionError) as info:
        call(ctx_for(replay), "pubmed.search", term="not recorded")
    assert info.value.retryable is False
    assert len(replay.requests) == 1


def test_summary_gives_one_item_per_pmid_in_order(stack: Stack, replay: ReplayServer) -> None:
    items = call(ctx_for(replay), "pubmed.summary", ids=[*REMI_IDS[::-1], REMI_IDS[0]])
    assert [item["pmid"] for item in items] == REMI_IDS[::-1]
    first = next(item for item in items if item["pmid"] == "39412876")
    assert first["journal"] == "Critical care (London, England)"
    assert first["doi"] == "10.1186/s13054-024-05110-2"
    assert first["authors"][:2] == ["Chen X", "Wang Y"]
    assert first["pubdate"] == "2024 Oct 15"
    assert "propofol" in first["title"]


def test_summary_sends_at_most_200_ids_per_request(stack: Stack, replay: ReplayServer) -> None:
    unknown = [str(30_000_000 + n) for n in range(444)]
    items = call(ctx_for(replay), "pubmed.summary", ids=[*REMI_IDS, *unknown])
    assert [item["pmid"] for item in items] == REMI_IDS
    sizes = [len(seen.params["id"].split(",")) for seen in replay.seen("/esummary.fcgi")]
    assert sizes == [200, 200, 50]


def test_summary_of_no_ids_makes_no_request(stack: Stack, replay: ReplayServer) -> None:
    assert call(ctx_for(replay), "pubmed.summary", ids=[]) == []
    assert replay.requests == []


TRANSIT_S = 0.1
"""How much one request's trip from its grant to the server may outlast another's on a machine
running the suite three tests at a time (one full run saw 11 arrivals within 0.953 s at 10/s):
the limiter spaces its grants exactly on Redis's clock (``tests/service/platform/
test_ratelimit.py``), and what reaches the server is spaced by the grants less that spread."""


def busiest_second(arrivals: list[float]) -> int:
    ordered = sorted(arrivals)
    return max(sum(1 for t in ordered if start <= t < start + 1.0) for start in ordered)


@pytest.mark.parametrize(
    ("key", "limit", "requests", "busiest_at_least"), [(None, 3, 7, 2), ("k3y", 10, 12, 4)]
)
def test_requests_reach_ncbi_at_most_at_the_rate_for_the_key(
    stack: Stack,
    replay: ReplayServer,
    key: str | None,
    limit: int,
    requests: int,
    busiest_at_least: int,
) -> None:
    """The ceiling holds but for the trips' spread; the floor only shows that a key lifts the
    rate above the keyless 3/s.

    How close the busiest second comes to the ceiling depends on how loaded the machine is.
    """
    ids = [*REMI_IDS, *(str(30_000_000 + n) for n in range(requests - len(REMI_IDS)))]
    call(ctx_for(replay, ncbi_api_key=key), "pubmed.summary", ids=ids, batch_size=1)
    arrivals = [seen.at for seen in replay.seen("/esummary.fcgi")]
    assert len(arrivals) == requests
    assert_no_window_exceeds(arrivals, limit, 1.0 - TRANSIT_S)
    assert busiest_second(arrivals) >= busiest_at_least


def test_an_unreachable_server_is_retried_then_reported_as_retryable(stack: Stack) -> None:
    ctx = make_ctx(pubmed_base_url="http://127.0.0.1:9/eutils", http_timeout_s=1)
    with pytest.raises(ActionError) as info:
        call(ctx, "pubmed.search", term=REMI_TERM)
    assert info.value.retryable is True
    assert info.value.details == {"reason": "transport", "attempts": 4}
