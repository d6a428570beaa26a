"""The enqueue bench's baseline: the endpoint a user would write without flowbeat.

    python -m bench.raw_api --port 8001

A FastAPI app with one ``POST /v1/jobs`` that parses the same JSON body with a pydantic model,
hands it to Celery's ``send_task`` for ``bench.raw_app``'s no-op task on the Redis broker in
``BENCH_RAW_REDIS_URL`` (its own DB number), stores nothing and answers 202 with the task's
id. The handler is ``async`` and calls ``send_task`` on the event loop: one blocking publish
of a few hundred microseconds costs less than the thread hop a sync handler would pay, so this
is the quicker of the two ways such an endpoint is usually written. No key is checked.

With ``BENCH_RAW_STORE_URL`` set (a libpq URL), the same endpoint first stores the job: one
``INSERT`` of its id, pipeline and params into a table with a primary key and nothing else,
committed on a connection from a psycopg pool before the task is sent. That is the least any
design that stores every job before it answers can do, so its latency over the bare
endpoint's is the floor under flowbeat's, measured on the same cores in the same rounds.
``BENCH_RAW_TASK`` names another task to send each job as (``bench.floor_app``'s, for the
floor side of ``bench.peers``).

It is served as ``flowbeat api`` serves flowbeat's API: uvicorn in one process, its default
loop and HTTP implementations (uvloop and httptools when installed), proxy headers on. Its
access log is uvicorn's default one, a line a request, as flowbeat's API writes one.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from celery import Celery
from fastapi import FastAPI
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, ConfigDict, Field

from bench.raw_app import CONF, NOOP


class JobIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pipeline: str
    params: dict[str, Any] = Field(default_factory=dict)


class Accepted(BaseModel):
    id: str


def _celery() -> Celery:
    """Broker only: with a result backend, Celery's Redis backend subscribes to each task's
    result channel as it sends it, and this endpoint means to store and wait for nothing; its
    messages also tell the worker to store no result (``ignore_result``)."""
    celery = Celery("bench_raw_api", broker=os.environ["BENCH_RAW_REDIS_URL"])
    celery.conf.update(CONF, task_ignore_result=True)
    return celery


STORE_TABLE = """
CREATE TABLE IF NOT EXISTS raw_jobs (
    id uuid PRIMARY KEY,
    pipeline text NOT NULL,
    params jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
)"""
_STORE_URL = os.environ.get("BENCH_RAW_STORE_URL")
_pool = AsyncConnectionPool(_STORE_URL, min_size=4, max_size=4, open=False) if _STORE_URL else None


@asynccontextmanager
async def _lifespan(_app: FastAPI) -> AsyncIterator[None]:
    if _pool is None:
        yield
        return
    await _pool.open(wait=True)
    async with _pool.connection() as conn:
        await conn.execute(STORE_TABLE)
    try:
        yield
    finally:
        await _pool.close()


_TASK = os.environ.get("BENCH_RAW_TASK", NOOP)
"""The task each job is sent as: the no-op, or the floor's chain (``bench.floor_app``)."""

app = FastAPI(title="raw enqueue baseline", lifespan=_lifespan)
_sender = _celery()


@app.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@app.post("/v1/jobs", status_code=202)
async def create_job(body: JobIn) -> Accepted:
    job_id = str(uuid.uuid4())
    if _pool is not None:
        async with _pool.connection() as conn:
            await conn.execute(
                "INSERT INTO raw_jobs (id, pipeline, params) VALUES (%s, %s, %s)",
                (job_id, body.pipeline, Jsonb(body.params)),
            )
    kwargs = {"pipeline": body.pipeline, "params": body.params}
    sent = _sender.send_task(_TASK, kwargs=kwargs, task_id=job_id, ignore_result=True)
    return Accepted(id=sent.id)


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m bench.raw_api", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args(argv)
    uvicorn.run("bench.raw_api:app", host=args.host, port=args.port, proxy_headers=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
