"""The dashboard's home, ``/ui/home``: the figures of ``GET /v1/overview``, each a link to the
jobs it counts, and a chart of the window drawn on the server as SVG like the job page's
timeline. The page polls its panel rather than following an event stream: its figures are
aggregates that change with the clock (a minute passes, a message ages) as much as with events,
and an all-jobs stream would carry every event of every job to each open page only to say
that something changed."""

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request, Response
from fastapi.responses import HTMLResponse

from api.deps import SessionDep
from api.routes.overview import BucketPublic, Overview, read_overview
from api.ui import Viewer, page
from service.engine.overview import Span

router = APIRouter(prefix="/ui", include_in_schema=False)

REFRESH_S = 5
CHART_W, CHART_H, AXIS_H, LABEL_W = 960, 150, 18, 36
TICKS = {Span.HOUR: 15, Span.DAY: 12}
"""Every how many buckets the time axis is labelled: each quarter hour, each three hours."""


def jobs_link(
    *,
    status: str = "",
    pipeline: str = "",
    since: datetime | None = None,
    until: datetime | None = None,
) -> str:
    """The job list filtered as a figure counts: by status, pipeline and submission window,
    ``[since, until)`` in ISO 8601."""
    query = {"status": status, "pipeline": pipeline}
    if since is not None and until is not None:
        query |= {"since": _iso(since), "until": _iso(until)}
    return "/ui/jobs?" + urlencode({k: v for k, v in query.items() if v})


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class Segment:
    kind: str
    y: float
    height: float
    count: int
    href: str


@dataclass(frozen=True)
class Column:
    x: float
    width: float
    title: str
    segments: list[Segment]


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    top: int
    columns: list[Column]
    ticks: list[tuple[float, str]]


def _column(bucket: BucketPublic, end: datetime, x: float, width: float, scale: float) -> Column:
    """Failed at the foot, succeeded above, then the rest (still open, or cancelled), each a
    link to the jobs it stands for."""
    rest = bucket.started - bucket.succeeded - bucket.failed
    parts = [("failed", bucket.failed), ("succeeded", bucket.succeeded), ("other", rest)]
    segments, foot = [], float(CHART_H)
    for kind, count in parts:
        if count <= 0:
            continue
        height = max(count * scale, 1.0)
        foot -= height
        status = "" if kind == "other" else kind
        href = jobs_link(status=status, since=bucket.at, until=end)
        segments.append(Segment(kind, round(foot, 1), round(height, 1), count, href))
    title = (
        f"{bucket.at:%H:%M}: {bucket.started} started, {bucket.succeeded} succeeded,"
        f" {bucket.failed} failed"
    )
    return Column(round(x, 1), round(width, 1), title, segments)


def chart(overview: Overview) -> Chart:
    series = overview.series
    top = max((b.started for b in series), default=0) or 1
    scale = (CHART_H - AXIS_H) / top
    width = (CHART_W - LABEL_W) / max(len(series), 1)
    ends = [b.at for b in series[1:]] + [overview.until]
    columns = [
        _column(bucket, end, LABEL_W + n * width, max(width - 1, 1.0), scale)
        for n, (bucket, end) in enumerate(zip(series, ends, strict=True))
    ]
    every = TICKS[overview.window]
    ticks = [(LABEL_W + n * width, f"{b.at:%H:%M}") for n, b in enumerate(series) if n % every == 0]
    return Chart(CHART_W, CHART_H + AXIS_H, top, columns, ticks)


def _context(request: Request, viewer: Viewer, session: SessionDep, window: Span) -> dict[str, Any]:
    overview = read_overview(request, viewer, session, window)
    return {
        "o": overview,
        "chart": chart(overview),
        "jobs_link": jobs_link,
        "windows": list(Span),
        "refresh_s": REFRESH_S,
    }


@router.get("/home", response_class=HTMLResponse)
def home_page(
    request: Request, viewer: Viewer, session: SessionDep, window: Span = Span.HOUR
) -> Response:
    return page(request, "home.html", **_context(request, viewer, session, window))


@router.get("/home/panel", response_class=HTMLResponse)
def home_panel(
    request: Request, viewer: Viewer, session: SessionDep, window: Span = Span.HOUR
) -> Response:
    """The part of the home page its script fetches again every ``REFRESH_S``."""
    return page(request, "home_panel.html", **_context(request, viewer, session, window))
