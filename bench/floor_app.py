"""The least a persisted 3-step chain does in a worker: the floor side of ``bench.peers``.

A bare Celery app, configured as ``bench.raw_app`` (the same settings, queue and broker from
``BENCH_RAW_REDIS_URL``), whose one task runs a job that ``bench.raw_api`` stored in
``raw_jobs`` (``BENCH_RAW_STORE_URL``): it claims the job with one statement whose commit does
not wait for the disk, then checkpoints three no-op steps with one statement each, committed
synchronously, the last also settling the job. That is as many statements as flowbeat's step
path sends for a chain job (a claim, then three checkpoints that each claim the next step), on
tables with a primary key and nothing else: no event log, no index for a reader, no trigger.
"""

import os
import uuid
from typing import Any

import psycopg
from celery import Celery, Task
from psycopg.types.json import Jsonb

from bench.raw_app import CONF

FLOOR_CHAIN = "bench.floor_chain"
STEPS = 3

TABLES = """
CREATE TABLE raw_jobs (
    id uuid PRIMARY KEY,
    pipeline text NOT NULL,
    params jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    status text,
    lease text
);
CREATE TABLE raw_steps (
    job_id uuid,
    step int,
    output jsonb,
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (job_id, step)
)"""
"""Made by the side before ``bench.raw_api`` starts, whose own ``CREATE TABLE IF NOT EXISTS``
then leaves them as they are."""

CLAIM = "UPDATE raw_jobs SET status = 'running', lease = %s WHERE id = %s AND status IS NULL"
CHECKPOINT = "INSERT INTO raw_steps (job_id, step, output) VALUES (%s, %s, %s)"
LAST_CHECKPOINT = f"""
    WITH done AS ({CHECKPOINT} RETURNING job_id)
    UPDATE raw_jobs SET status = 'succeeded' FROM done WHERE raw_jobs.id = done.job_id"""

app = Celery("bench_floor", broker=os.environ.get("BENCH_RAW_REDIS_URL", "redis://unset"))
app.conf.update(CONF, task_ignore_result=True)

_connections: dict[str, psycopg.Connection[Any]] = {}


def _connection(name: str) -> psycopg.Connection[Any]:
    """One connection of each kind per pool process, opened on its first task (after the
    fork): ``claims`` does not wait for the disk at commit, ``checkpoints`` does."""
    if name not in _connections:
        conn = psycopg.connect(os.environ["BENCH_RAW_STORE_URL"], autocommit=True)
        if name == "claims":
            conn.execute("SET synchronous_commit = off")
        _connections[name] = conn
    return _connections[name]


@app.task(name=FLOOR_CHAIN, bind=True)  # type: ignore[untyped-decorator]
def floor_chain(self: Task, **_body: Any) -> None:
    job_id = self.request.id
    claims, checkpoints = _connection("claims"), _connection("checkpoints")
    claims.execute(CLAIM, (uuid.uuid4().hex, job_id))
    for step in range(1, STEPS + 1):
        statement = LAST_CHECKPOINT if step == STEPS else CHECKPOINT
        checkpoints.execute(statement, (job_id, step, Jsonb({"step": step})))
