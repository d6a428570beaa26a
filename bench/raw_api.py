"""The enqueue bench's baseline: the endpoint a user would write without flowbeat.

    python -m bench.raw_api --port 8001

A FastAPI app with one ``POST /v1/jobs`` that parses the same JSON body with a pydantic model,
hands it to Celery's ``send_task`` for ``bench.raw_app``'s no-op task on the Redis broker in
``BENCH_RAW_REDIS_URL`` (its own DB number), stores nothing and answers 202 with the task's
id. The handler is ``async`` and calls ``send_task`` on the event loop: one blocking publish
of a few hundred microseconds costs less than the thread hop a sync handler would pay, so this
is the quicker of the two ways such an endpoint is usually written. No key is checked.

It is served as ``flowbeat api`` serves flowbeat's API: uvicorn in one process, its default
loop and HTTP implementations (uvloop and httptools when installed), proxy headers on. Its
access log is uvicorn's default one, a line a request, as flowbeat's API writes one.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from celery import Celery
from fastapi import FastAPI
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
    result channel as it sends it, and this endpoint means to store and wait for nothing."""
    celery = Celery("bench_raw_api", broker=os.environ["BENCH_RAW_REDIS_URL"])
    celery.conf.update(CONF, task_ignore_result=True)
    return celery


app = FastAPI(title="raw enqueue baseline")
_sender = _celery()


@app.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@app.post("/v1/jobs", status_code=202)
async def create_job(body: JobIn) -> Accepted:
    sent = _sender.send_task(NOOP, kwargs={"pipeline": body.pipeline, "params": body.params})
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
