"""Actions for end-to-end tests and fault drills: side effects a test can count from outside."""

import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import psycopg
import redis
from sqlalchemy import make_url

from service.actions import StepContext, action
from service.platform.errors import ActionError
from tests.support.servers import DRILL_RUN_ENV, run_jobs_key

KEY_TTL_S = 3600
"""Counters outlive a flush of the broker's DB, not the test run that reads them."""

log = logging.getLogger(__name__)


def _redis() -> redis.Redis:
    """DB 0 of the broker's server, or ``DRILL_REDIS_URL`` when a drill restarts that server."""
    default = os.environ["FLOWBEAT_BROKER_URL"].rsplit("/", 1)[0] + "/0"
    return redis.Redis.from_url(os.environ.get("DRILL_REDIS_URL", default))


def _key(ctx: StepContext, name: str) -> str:
    return f"drill:{ctx.job_id}:{name}"


def _note_job(client: redis.Redis, ctx: StepContext) -> None:
    """Adds the job to its test run's set, which the run reads to delete its counters."""
    run = os.environ.get(DRILL_RUN_ENV)
    if run:
        client.sadd(run_jobs_key(run), str(ctx.job_id))
        client.expire(run_jobs_key(run), KEY_TTL_S)


def _bump(client: redis.Redis, key: str) -> None:
    with client.pipeline() as pipe:
        pipe.incr(key)
        pipe.expire(key, KEY_TTL_S)
        pipe.execute()


@action("drill.count")
def count(
    ctx: StepContext, name: str, value: Any = None, hold_s: float = 0.0, heed: bool = True
) -> dict[str, Any]:
    """Count one execution in Redis DB 0 (which flushing the broker's DB does not touch);
    with ``heed`` false, hold in one plain sleep that never looks at the step's cancel."""
    log.info("drill.count %s", name)
    client = _redis()
    _note_job(client, ctx)
    _bump(client, _key(ctx, f"{name}:started"))
    client.set(_key(ctx, f"{name}:pid"), os.getpid(), ex=KEY_TTL_S)
    deadline = time.monotonic() + hold_s
    if not heed:
        time.sleep(hold_s)
    while time.monotonic() < deadline:
        ctx.sleep(min(0.1, max(deadline - time.monotonic(), 0.0)))
    _bump(client, _key(ctx, f"{name}:finished"))
    return {"name": name, "value": value}


@action("drill.stamp")
def stamp(ctx: StepContext, name: str, hold_s: float = 0.0) -> dict[str, Any]:
    """Note when the action started, on this machine's clock, in the list ``drill:stamps:<name>``
    of Redis DB 0: a test reads the start times of every step that named ``name``."""
    started = time.time()
    client = _redis()
    _note_job(client, ctx)
    with client.pipeline() as pipe:
        pipe.rpush(f"drill:stamps:{name}", started)
        pipe.expire(f"drill:stamps:{name}", KEY_TTL_S)
        pipe.execute()
    client.set(_key(ctx, f"{name}:pid"), os.getpid(), ex=KEY_TTL_S)
    deadline = time.monotonic() + hold_s
    while time.monotonic() < deadline:
        ctx.sleep(min(0.1, max(deadline - time.monotonic(), 0.0)))
    return {"started": started}


@action("drill.fail_on")
def fail_on(ctx: StepContext, name: str, value: Any = None, bad: Any = ()) -> dict[str, Any]:
    """Count the run, then fail for good when ``value`` is one of ``bad``."""
    count(ctx, name, value)
    if value in bad:
        raise ActionError(f"{name}: {value!r} is bad", {"value": value}, retryable=False)
    return {"name": name, "value": value}


@action("drill.review")
def review(ctx: StepContext, name: str, round: int, approve_at: int, hold_s: float = 0.0) -> Any:
    """A reviewer that approves from round ``approve_at`` on, with remarks until then."""
    count(ctx, name, round, hold_s)
    approved = round >= approve_at
    return {"approved": approved, "remarks": None if approved else f"round {round} needs work"}


@action("drill.undo")
def undo(ctx: StepContext, name: str, hold_s: float = 0.0, fail: bool = False) -> dict[str, Any]:
    """A compensation: counted, its order kept in a list, failing for good when asked to."""
    client = _redis()
    with client.pipeline() as pipe:
        pipe.rpush(_key(ctx, "undo-order"), name)
        pipe.expire(_key(ctx, "undo-order"), KEY_TTL_S)
        pipe.set(_key(ctx, f"{name}:key"), ctx.idempotency_key or "", ex=KEY_TTL_S)
        pipe.execute()
    count(ctx, name, hold_s=hold_s)
    if fail:
        raise ActionError(f"{name} cannot be undone", retryable=False)
    return {"undone": name}


def named_connections(database_url: str, application_name: str) -> str:
    """``database_url`` with every connection made from it named, for ``drop_connections``."""
    url = make_url(database_url).update_query_dict({"application_name": application_name})
    return url.render_as_string(hide_password=False)


def _unnamed(database_url: str) -> str:
    return make_url(database_url).set(drivername="postgresql", query={}).render_as_string(False)


def drop_connections(database_url: str, application_name: str) -> None:
    """Have PostgreSQL end every connection of that name, as a restart or a failover would. An
    idle one is replaced before its next statement (``hung_up``): to fail a statement, end it
    in flight (``cut_in_flight``)."""
    with psycopg.connect(_unnamed(database_url), autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
            " WHERE application_name = %s AND pid <> pg_backend_pid()",
            (application_name,),
        )


CUT_WAIT_S = 30.0


def cut_in_flight(
    database_url: str, application_name: str, lock: str, params: Sequence[Any]
) -> threading.Thread:
    """Take the row locks the statement ``lock`` takes, in a transaction left open, and end the
    first connection named ``application_name`` that comes to wait on them, as a restart or a
    failover ends a statement in flight; then let the locks go. Returns the thread that waits."""
    url = _unnamed(database_url)
    holder = psycopg.connect(url)
    holder.execute(lock, params)

    def cut() -> None:
        try:
            with psycopg.connect(url, autocommit=True) as watcher:
                deadline = time.monotonic() + CUT_WAIT_S
                while time.monotonic() < deadline:
                    ended = watcher.execute(
                        "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
                        " WHERE application_name = %s AND wait_event_type = 'Lock'",
                        (application_name,),
                    ).fetchall()
                    if ended:
                        return
                    time.sleep(0.01)
        finally:
            holder.rollback()
            holder.close()

    thread = threading.Thread(target=cut, name="cut-in-flight", daemon=True)
    thread.start()
    return thread


LOCK_OWN_ROW = (
    "SELECT 1 FROM step_runs WHERE job_id = %s AND step_id = %s AND shard = %s FOR UPDATE"
)


@action("drill.drop_connections")
def drop_connections_once(ctx: StepContext, fail: bool = False) -> dict[str, Any]:
    """In a worker whose connections are named (``named_connections``), the server ends the
    statement that records the first attempt's outcome, a success or, with ``fail``, a failure:
    its step's row is locked and whichever of the worker's connections comes to wait on it is
    ended. Later attempts, and attempts in other workers, just succeed."""
    url = ctx.settings.require_database_url()
    name = make_url(url).query.get("application_name")
    if ctx.attempt == 1 and isinstance(name, str):
        shard = -1 if ctx.shard is None else ctx.shard
        cut_in_flight(url, name, LOCK_OWN_ROW, (ctx.job_id, ctx.step_id, shard))
        if fail:
            raise ActionError("connections dropped", {"attempt": ctx.attempt})
    return {"attempt": ctx.attempt}


@action("drill.gate")
def gate(ctx: StepContext, name: str, hold_s: float = 0.0) -> dict[str, Any]:
    """Fail for good while ``drill:gate:<name>`` is ``closed`` in Redis DB 0: an outage that a
    person fixes, then reruns the job from this step."""
    count(ctx, name, hold_s=hold_s)
    if _redis().get(f"drill:gate:{name}") == b"closed":
        raise ActionError(f"{name}: the gate is closed", {"gate": name}, retryable=False)
    return {"name": name, "passed": True}


@action("drill.work")
def work(
    ctx: StepContext, hold_s: float = 0.0, value: Any = None, round: int | None = None
) -> dict[str, Any]:
    """Record each execution's start and end (pid, time, attempt) in Redis DB 0, for the chaos
    suite to find lost, doubled and concurrent runs of a step or item after the fact, under
    ``chaos:<job>:<step>:<tail>``: the tail is the item (``-1`` outside a fan-out), ``r<round>``
    for a step in a loop (which passes its ``round``: each round is a run of its own), or
    ``undo`` for a compensation."""
    client = _redis()
    if ctx.idempotency_key is not None:
        tail = "undo"
    elif round is not None:
        tail = f"r{round}"
    else:
        tail = str(-1 if ctx.shard is None else ctx.shard)
    key = f"chaos:{ctx.job_id}:{ctx.step_id}:{tail}"

    def note(event: str) -> None:
        record = {"e": event, "pid": os.getpid(), "t": time.time(), "attempt": ctx.attempt}
        with client.pipeline() as pipe:
            pipe.rpush(key, json.dumps(record))
            pipe.expire(key, KEY_TTL_S)
            pipe.execute()

    _note_job(client, ctx)
    note("start")
    deadline = time.monotonic() + hold_s
    while time.monotonic() < deadline:
        ctx.sleep(min(0.05, max(deadline - time.monotonic(), 0.0)))
    note("end")
    return {"value": value}


@action("drill.chatter")
def chatter(
    ctx: StepContext, lines: int = 1, fail_attempts: int = 0, hold_s: float = 0.0, say: str = ""
) -> dict[str, Any]:
    """Say something three ways per line (``ctx.log``, a module logger, ``print``), waiting
    ``hold_s`` between lines, then print ``say`` if given; fail the first ``fail_attempts``
    attempts after saying it all."""
    for n in range(1, lines + 1):
        ctx.log.info("ctx line %d of attempt %d", n, ctx.attempt)
        log.warning("logger line %d", n)
        print(f"printed line {n}")
        if n < lines:
            ctx.sleep(hold_s)
    if say:
        print(say)
    if ctx.attempt <= fail_attempts:
        raise ActionError(f"attempt {ctx.attempt} fails on purpose", retryable=True)
    return {"lines": lines}
