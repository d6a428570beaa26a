"""Counters and histograms of what each process does, for Prometheus.

Labels are kept to names an operator chose (pipeline, action, provider, model) and small fixed
sets (status, outcome, cause, trigger, route template): never a job, step or key id, so a
series count does not grow with traffic. Values are counted after the transaction that made
them true has committed, or where there is none, after the effect happened.

Each process counts its own. A prefork worker's pool processes share theirs through
prometheus-client's multiprocess mode: ``flowbeat worker`` points ``PROMETHEUS_MULTIPROC_DIR``
at a fresh directory before the worker starts, and the worker's exporter sums the files of
every pool process (``registry``). PostgreSQL-wide gauges (jobs by status, open steps, queue
depth) are read at scrape time by the API's ``/metrics`` instead, so every replica agrees.
"""

import hmac
import os
import shutil
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)
from sqlalchemy import event
from sqlalchemy.orm import Session, SessionTransaction

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)

JOBS_SUBMITTED = Counter(
    "flowbeat_jobs_submitted_total",
    "Jobs accepted, by pipeline and trigger (api, schedule, webhook, dependency, rerun).",
    ["pipeline", "trigger"],
)
JOBS_FINISHED = Counter(
    "flowbeat_jobs_finished_total",
    "Jobs that reached a final status (succeeded, failed, cancelled), by pipeline and trigger.",
    ["pipeline", "trigger", "status"],
)
STEP_SECONDS = Histogram(
    "flowbeat_step_duration_seconds",
    "Time an attempt's action ran, by action and outcome (ok, error).",
    ["action", "outcome"],
    buckets=SECONDS_BUCKETS,
)
STEP_QUEUE_WAIT = Histogram(
    "flowbeat_step_queue_wait_seconds",
    "Time from a step's message being sent (the step was ready) to a worker starting it, by "
    "task (run_step, run_lane, finish_fanout).",
    ["task"],
    buckets=SECONDS_BUCKETS,
)
STEP_RETRIES = Counter(
    "flowbeat_step_retries_total",
    "Failed attempts that will be tried again, by action.",
    ["action"],
)
STEP_CACHE_HITS = Counter(
    "flowbeat_step_cache_hits_total",
    "Steps settled with an output from the step cache instead of running, by action.",
    ["action"],
)
FANOUT_ITEMS = Counter(
    "flowbeat_fanout_items_total",
    "Items of for_each steps run to an outcome, by action.",
    ["action"],
)
BEAT_FIRE_LAG = Histogram(
    "flowbeat_beat_fire_lag_seconds",
    "Time from a schedule's fire time to its job being stored and sent.",
    buckets=SECONDS_BUCKETS,
)
BEAT_LEADER_CHANGES = Counter(
    "flowbeat_beat_leader_changes_total",
    "Times this beat replica became (gained) or stopped being (lost) the leader.",
    ["change"],
)
SWEEPER_REPUBLISHED = Counter(
    "flowbeat_sweeper_republished_total",
    "Jobs the sweeper sent again, by cause (broker_lost, undispatched, lease_expired, "
    "lost_in_flight, stalled, timed_out, compensation_lost).",
    ["cause"],
)
WORKER_MESSAGES_RESTORED = Counter(
    "flowbeat_worker_messages_restored_total",
    "Messages a dead worker had taken, sent back to their queues by a live one.",
)
API_REQUEST_SECONDS = Histogram(
    "flowbeat_api_request_duration_seconds",
    "API request latency by route template, method and status class (2xx, 4xx, 5xx).",
    ["route", "method", "status"],
    buckets=SECONDS_BUCKETS,
)
NOTICE_DELIVERIES = Counter(
    "flowbeat_notice_deliveries_total",
    "Outgoing notices and escalations by kind and outcome (delivered, retried, gave_up).",
    ["kind", "outcome"],
)
ALERTS = Counter(
    "flowbeat_alerts_total",
    "Alerts by rule kind and outcome: queued and suppressed (a dedupe window held it back) by "
    "the beat leader; delivered, retried and gave_up by the worker sending them.",
    ["kind", "outcome"],
)
WEBHOOK_DELIVERIES = Counter(
    "flowbeat_webhook_deliveries_total",
    "Incoming webhook deliveries by outcome (accepted, replayed, refused code).",
    ["outcome"],
)
RATE_LIMIT_STEPS = Counter(
    "flowbeat_rate_limit_steps_total",
    "Step attempts that asked a rate limit for room, by the key as the profile writes it "
    "(before params resolve it) and outcome (granted, parked).",
    ["key", "outcome"],
)
LLM_TOKENS = Counter(
    "flowbeat_llm_tokens_total",
    "Tokens of llm.chat and llm.embed calls by provider, model and kind (prompt, completion).",
    ["provider", "model", "kind"],
)
LLM_REQUEST_SECONDS = Histogram(
    "flowbeat_llm_request_duration_seconds",
    "Latency of LLM provider requests by provider and model.",
    ["provider", "model"],
    buckets=SECONDS_BUCKETS,
)


_UNCOUNTED = "flowbeat.metrics.uncounted"


def after_commit(session: Session, count: Callable[[], None]) -> None:
    """Count once ``session``'s transaction commits; nothing if it, or the savepoint the count
    was made in, rolls back (a schedule fire that lost its fence creates no job).

    Kept in the session's ``info`` for the two listeners below rather than as a listener of
    the session's own: registering one costs more than the count, and one left by a rolled-back
    transaction would count at the session's next commit."""
    within = session.get_nested_transaction() or session.get_transaction()
    session.info.setdefault(_UNCOUNTED, []).append((within, count))


@event.listens_for(Session, "after_commit")
def _count_committed(session: Session) -> None:
    for _, count in session.info.pop(_UNCOUNTED, ()):
        count()


@event.listens_for(Session, "after_soft_rollback")
def _forget_rolled_back(session: Session, ended: SessionTransaction) -> None:
    kept = [(tx, count) for tx, count in session.info.get(_UNCOUNTED, ()) if not _inside(tx, ended)]
    session.info[_UNCOUNTED] = kept


def _inside(tx: SessionTransaction | None, ended: SessionTransaction) -> bool:
    """Whether ``tx`` is ``ended`` or a savepoint within it; ``None`` (made before the session
    began) belongs to the outermost transaction."""
    if tx is None:
        return ended.parent is None
    while tx is not None:
        if tx is ended:
            return True
        tx = tx.parent
    return False


def job_finished(session: Session | None, pipeline: str, trigger: str, status: str) -> None:
    """A job of ``pipeline`` started by ``trigger`` reached ``status``: counted at the commit
    when a session is given, at once otherwise (the caller's statement has committed)."""

    def count() -> None:
        JOBS_FINISHED.labels(pipeline, trigger, status).inc()

    if session is None:
        count()
    else:
        after_commit(session, count)


def registry() -> CollectorRegistry:
    """What this process exports: every process's files in multiprocess mode, else its own."""
    if not os.environ.get(MULTIPROC_ENV):
        return REGISTRY
    collected = CollectorRegistry()
    multiprocess.MultiProcessCollector(collected)  # type: ignore[no-untyped-call]
    return collected


def exposition(extra: Iterable[CollectorRegistry] = ()) -> bytes:
    """The text format of this process's metrics and of ``extra`` registries after them."""
    return b"".join(generate_latest(r) for r in (registry(), *extra))


def fresh_multiproc_dir(path: Path) -> Path:
    """An empty directory for a worker's metric files: files of an earlier run would add
    their counts to this one's."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def process_exited(pid: int) -> None:
    if os.environ.get(MULTIPROC_ENV):
        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not worth a log line each."""


def _exporter_app(token: str | None) -> Callable[..., Iterable[bytes]]:
    expected = f"Bearer {token}".encode() if token else None

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        given = environ.get("HTTP_AUTHORIZATION", "").encode()
        if expected is not None and not hmac.compare_digest(given, expected):
            start_response("401 Unauthorized", [("WWW-Authenticate", "Bearer")])
            return [b"missing or invalid metrics token\n"]
        if environ.get("PATH_INFO") != "/metrics":
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found\n"]
        start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST)])
        return [exposition()]

    return app


def serve(host: str, port: int, token: str | None) -> WSGIServer:
    """A ``/metrics`` exporter for a worker or beat, on a daemon thread; with ``token`` a scrape
    must send it as a bearer token (``serve_refusal`` says when one is required)."""
    server = make_server(host, port, _exporter_app(token), handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server


LOOPBACK = {"127.0.0.1", "::1", "localhost"}


def serve_refusal(host: str, token: str | None) -> str | None:
    """Why an exporter may not start as configured: off loopback it needs a token."""
    if token or host in LOOPBACK:
        return None
    return f"a metrics exporter on {host} needs FLOWBEAT_METRICS_TOKEN"
