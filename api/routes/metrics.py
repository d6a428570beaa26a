"""``GET /metrics`` in Prometheus' text format, behind a read key like everything but /health.

Gauges are read from PostgreSQL and the broker at scrape time, so every API replica reports
the same truth and nothing is added to the request path; after them come this process's own
counters and histograms (``service.platform.metrics``).
"""

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

from fastapi import APIRouter, FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from api.deps import Reader, broker_probe
from service.engine.runtime import Runtime
from service.engine.stats import jobs_by_status, steps_by_open_status
from service.platform.constants import BEAT_LOCK_KEY, QUEUE_CONTROL
from service.platform.metrics import exposition
from tasks.broker import queue_states
from tasks.queues import queue_name

router = APIRouter(tags=["metrics"])


class _StateCollector(Collector):
    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    def collect(self) -> Iterable[Metric]:
        with self._runtime.sessions() as session:
            jobs, steps = jobs_by_status(session), steps_by_open_status(session)
        yield _gauge("flowbeat_jobs", "Jobs by status.", "status", jobs)
        yield _gauge("flowbeat_open_steps", "Open steps and shards by status.", "status", steps)
        settings = self._runtime.settings
        with broker_probe(settings) as client:
            queues = queue_states(client, settings.worker_dead_after_s)
            depth = {queue_name(q.name): q.depth for q in queues}
            depth[QUEUE_CONTROL] = int(client.llen(QUEUE_CONTROL))
            now = datetime.fromtimestamp(float(client.time()[0]), UTC)
            leader = bool(client.exists(BEAT_LOCK_KEY))
        yield _gauge("flowbeat_queue_depth", "Messages waiting on a broker queue.", "queue", depth)
        ages = {
            queue_name(q.name): max(0.0, (now - q.oldest_sent).total_seconds())
            for q in queues
            if q.oldest_sent is not None
        }
        yield _gauge(
            "flowbeat_queue_oldest_age_seconds",
            "How long the oldest message waiting on a step queue has waited.",
            "queue",
            ages,
        )
        workers = {queue_name(q.name): len(q.workers) for q in queues}
        yield _gauge(
            "flowbeat_queue_workers", "Live workers consuming a step queue.", "queue", workers
        )
        yield GaugeMetricFamily(
            "flowbeat_beat_leader",
            "1 while a beat replica holds the leader lock, 0 when none does.",
            value=int(leader),
        )


def _gauge(name: str, doc: str, label: str, values: Mapping[str, float]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([key], value)
    return family


def install_metrics(app: FastAPI, runtime: Runtime) -> None:
    """A registry per app, so several apps in one process (tests) never share series."""
    registry = CollectorRegistry()
    registry.register(_StateCollector(runtime))
    app.state.metrics = registry


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {
            "description": "Prometheus' text exposition format",
            "content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}},
        }
    },
)
def metrics(request: Request, _: Reader) -> Response:
    registry: CollectorRegistry = request.app.state.metrics
    return Response(exposition([registry]), media_type=CONTENT_TYPE_LATEST)
