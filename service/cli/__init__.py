"""The ``flowbeat`` command: the composition root, one module per group of commands.

It is the one place in ``service/`` that starts the API, the Celery worker and beat, and it
does so through subprocesses or imports inside the command that needs them, so the rest of
``service/`` stays free of FastAPI and Celery. It may import every other package of ``service``;
none of them imports it.
"""

from service.cli import (
    actions,
    alerts,
    audit,
    backfills,
    flower,
    follow,
    jobs,
    keys,
    mcp,
    pipelines,
    queues,
    ratelimits,
    schedules,
    servers,
)
from service.cli.app import cli, main

__all__ = [
    "actions",
    "alerts",
    "audit",
    "backfills",
    "cli",
    "flower",
    "follow",
    "jobs",
    "keys",
    "main",
    "mcp",
    "pipelines",
    "queues",
    "ratelimits",
    "schedules",
    "servers",
]
