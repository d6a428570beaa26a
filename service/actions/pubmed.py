"""PubMed through NCBI E-utilities: ``pubmed.search`` (esearch) and ``pubmed.summary`` (esummary).

Every request carries ``tool`` and ``email`` (and ``api_key`` when set), as NCBI asks, and goes
through one rate limit shared by all workers of the deployment: 3 requests per second without
a key, 10 with one. The window is slightly over a second so that jitter between taking a slot
and the request reaching NCBI cannot push a burst over their limit.
"""

import re
from typing import Any

from service.actions.context import StepContext
from service.actions.registry import action
from service.actions.scholarly import bad_inputs, get_json
from service.platform.constants import NCBI_RATE_LIMIT_NAME, NCBI_RATE_WINDOW_S
from service.platform.errors import ActionError
from service.platform.ratelimit import RateLimiter, redis_client
from service.platform.settings import Settings

MAX_RETMAX = 10_000
SUMMARY_BATCH = 200
DATETYPES = frozenset({"pdat", "edat", "mdat"})
SORTS = frozenset({"relevance", "pub_date", "Author", "JournalName"})
_ISO_DATE = re.compile(
    r"^(?P<y>\d{4})-(?P<m>\d{2})-(?P<d>\d{2})(?:[T ][0-9:.]+(?:Z|[+-]\d{2}:?\d{2})?)?$"
)


def ncbi_limiter(settings: Settings) -> RateLimiter:
    limit = settings.ncbi_rate_per_s_with_key if settings.ncbi_api_key else settings.ncbi_rate_per_s
    client = redis_client(settings.broker())
    return RateLimiter(NCBI_RATE_LIMIT_NAME, limit, NCBI_RATE_WINDOW_S, client=client)


def _common(settings: Settings) -> dict[str, str]:
    params = {"db": "pubmed", "retmode": "json", "tool": settings.ncbi_tool}
    if settings.ncbi_email:
        params["email"] = settings.ncbi_email
    if settings.ncbi_api_key:
        params["api_key"] = settings.ncbi_api_key
    return params


def _eutil(ctx: StepContext, action_name: str, endpoint: str, params: dict[str, Any]) -> Any:
    url = f"{ctx.settings.pubmed_base_url.rstrip('/')}/{endpoint}"
    body = get_json(
        ctx, action_name, url, {**_common(ctx.settings), **params}, ncbi_limiter(ctx.settings)
    )
    if not isinstance(body, dict):
        raise ActionError(f"{action_name}: unexpected reply", {"reason": "bad_reply"})
    return body


def _ncbi_date(value: str) -> str:
    """E-utilities take ``YYYY/MM/DD`` (or ``YYYY/MM``, ``YYYY``); an ISO 8601 date or time,
    as ``${{ schedule.fire_time }}`` reads, is taken by its date."""
    iso = _ISO_DATE.match(value) if isinstance(value, str) else None
    return f"{iso['y']}/{iso['m']}/{iso['d']}" if iso else value


@action("pubmed.search", cache=False)
def search(
    ctx: StepContext,
    term: str,
    retmax: int = 100,
    mindate: str | None = None,
    maxdate: str | None = None,
    datetype: str = "pdat",
    sort: str | None = None,
) -> dict[str, Any]:
    """The PMIDs matching ``term``, with the total count and how PubMed understood the query."""
    if not isinstance(term, str) or not term.strip():
        raise bad_inputs("pubmed.search", "term must be a non-empty string")
    if isinstance(retmax, bool) or not isinstance(retmax, int) or not 0 <= retmax <= MAX_RETMAX:
        raise bad_inputs("pubmed.search", f"retmax must be an integer from 0 to {MAX_RETMAX}")
    if (mindate is None) != (maxdate is None):
        raise bad_inputs("pubmed.search", "give both mindate and maxdate, or neither")
    if datetype not in DATETYPES:
        raise bad_inputs("pubmed.search", f"datetype must be one of {sorted(DATETYPES)}")
    if sort is not None and sort not in SORTS:
        raise bad_inputs("pubmed.search", f"sort must be one of {sorted(SORTS)}")
    params: dict[str, Any] = {"term": term, "retmax": retmax}
    if mindate is not None and maxdate is not None:
        params.update(mindate=_ncbi_date(mindate), maxdate=_ncbi_date(maxdate), datetype=datetype)
    if sort is not None:
        params["sort"] = sort
    reply = _eutil(ctx, "pubmed.search", "esearch.fcgi", params).get("esearchresult")
    if not isinstance(reply, dict):
        raise ActionError("pubmed.search: reply has no esearchresult", {"reason": "bad_reply"})
    if "ERROR" in reply:
        raise ActionError(
            f"pubmed.search: PubMed refused the query: {reply['ERROR']}",
            {"reason": "query_refused"},
            retryable=False,
        )
    return {
        "count": int(reply.get("count", 0)),
        "ids": [str(pmid) for pmid in reply.get("idlist", [])],
        "query_translation": str(reply.get("querytranslation", "")),
    }


def _item(doc: dict[str, Any]) -> dict[str, Any]:
    doi = next(
        (a.get("value") for a in doc.get("articleids", []) if a.get("idtype") == "doi"), None
    )
    return {
        "pmid": str(doc["uid"]),
        "title": doc.get("title", ""),
        "journal": doc.get("fulljournalname") or doc.get("source", ""),
        "pubdate": doc.get("pubdate", ""),
        "authors": [
            a["name"] for a in doc.get("authors", []) if a.get("authtype", "Author") == "Author"
        ],
        "doi": doi,
    }


@action("pubmed.summary")
def summary(ctx: StepContext, ids: list[str], batch_size: int = SUMMARY_BATCH) -> list[Any]:
    """One item per PMID, in the order given; ids PubMed does not know are left out.

    Ids are sent ``batch_size`` (at most 200) per request, the size NCBI asks for on GET.
    """
    if not isinstance(ids, list) or not all(isinstance(i, str | int) for i in ids):
        raise bad_inputs("pubmed.summary", "ids must be a list of PMIDs")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise bad_inputs("pubmed.summary", "batch_size must be an integer")
    if not 1 <= batch_size <= SUMMARY_BATCH:
        raise bad_inputs("pubmed.summary", f"batch_size must be from 1 to {SUMMARY_BATCH}")
    wanted = list(dict.fromkeys(str(i) for i in ids))
    items: list[Any] = []
    for start in range(0, len(wanted), batch_size):
        batch = wanted[start : start + batch_size]
        result = _eutil(ctx, "pubmed.summary", "esummary.fcgi", {"id": ",".join(batch)}).get(
            "result", {}
        )
        for pmid in batch:
            doc = result.get(pmid)
            if isinstance(doc, dict) and "error" not in doc and "uid" in doc:
                items.append(_item(doc))
    return items
