"""The chaos suite drives the same real processes as the end-to-end tests, with their fixtures."""

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from sqlalchemy import make_url

from tests.e2e.conftest import (
    Cluster,
    browser,
    client,
    cluster,
    pytest_runtest_makereport,
    shared_worker,
)
from tests.support.tcpproxy import TcpProxy

__all__ = ["browser", "client", "cluster", "pytest_runtest_makereport", "shared_worker"]

RUNS_KEPT = "1000000"


@pytest.fixture(autouse=True)
def _keep_every_run(cluster: Cluster) -> None:
    """A full-scale scenario runs thousands of jobs of one pipeline; retention would delete all
    but the newest of them (and their checkpoints) before they are examined."""
    cluster.env["FLOWBEAT_RUNS_KEPT_PER_PIPELINE"] = RUNS_KEPT


@dataclass(frozen=True)
class ProxiedRedis:
    proxy: TcpProxy
    url: str
    """The stack's broker, reached through ``proxy``."""


@pytest.fixture
def redis_proxy(cluster: Cluster) -> Iterator[ProxiedRedis]:
    """The stack's Redis behind a TCP proxy the test controls. The drill action records its
    executions on Redis directly, so what the proxy does to a worker never loses the record.
    The cluster's processes stop before the proxy closes: a worker whose broker went away
    under it as it stopped took the whole 15 s stop timeout, then was killed."""
    broker = make_url(cluster.stack.broker_url)
    cluster.env["DRILL_REDIS_URL"] = cluster.stack.broker_url.rsplit("/", 1)[0] + "/0"
    with TcpProxy(broker.host or "127.0.0.1", broker.port or 6379) as proxy:
        try:
            yield ProxiedRedis(proxy, f"redis://127.0.0.1:{proxy.port}/{broker.database}")
        finally:
            cluster.close()
