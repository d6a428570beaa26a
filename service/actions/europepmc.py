"""``europepmc.search``: the Europe PMC REST search, lite results, paged by cursor."""

from typing import Any

from service.actions.context import StepContext
from service.actions.registry import action
from service.actions.scholarly import bad_inputs, get_json

MAX_PAGE = 1000
MAX_LIMIT = 100_000


def _item(hit: dict[str, Any]) -> dict[str, Any]:
    authors = [a.strip().rstrip(".") for a in str(hit.get("authorString", "")).split(",")]
    return {
        "id": str(hit.get("id", "")),
        "source": hit.get("source", ""),
        "pmid": hit.get("pmid"),
        "pmcid": hit.get("pmcid"),
        "doi": hit.get("doi"),
        "title": hit.get("title", ""),
        "journal": hit.get("journalTitle", ""),
        "pubdate": hit.get("firstPublicationDate") or hit.get("pubYear", ""),
        "authors": [a for a in authors if a],
    }


@action("europepmc.search", cache=False)
def search(ctx: StepContext, query: str, limit: int = 100) -> list[Any]:
    """Up to ``limit`` hits in relevance order; items carry ``id`` and, when known, ``pmid``.

    ``cursorMark`` paging is what Europe PMC recommends past the first page: it is stable while
    the index changes, unlike page numbers. Paging stops at ``limit``, on an empty page, or when
    the cursor stops moving.
    """
    if not isinstance(query, str) or not query.strip():
        raise bad_inputs("europepmc.search", "query must be a non-empty string")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise bad_inputs("europepmc.search", f"limit must be an integer from 1 to {MAX_LIMIT}")
    url = f"{ctx.settings.europepmc_base_url.rstrip('/')}/search"
    items: list[Any] = []
    cursor = "*"
    while len(items) < limit:
        page = get_json(
            ctx,
            "europepmc.search",
            url,
            {
                "query": query,
                "format": "json",
                "resultType": "lite",
                "pageSize": min(limit - len(items), MAX_PAGE),
                "cursorMark": cursor,
            },
        )
        hits = page.get("resultList", {}).get("result", []) if isinstance(page, dict) else []
        items.extend(_item(hit) for hit in hits[: limit - len(items)])
        following = page.get("nextCursorMark") if isinstance(page, dict) else None
        if not hits or not following or following == cursor:
            break
        cursor = following
    return items
