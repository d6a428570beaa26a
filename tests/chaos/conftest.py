"""The chaos suite drives the same real processes as the end-to-end tests, with their fixtures."""

import pytest

from tests.e2e.conftest import Cluster, browser, client, cluster, shared_worker

__all__ = ["browser", "client", "cluster", "shared_worker"]

RUNS_KEPT = "1000000"


@pytest.fixture(autouse=True)
def _keep_every_run(cluster: Cluster) -> None:
    """A full-scale scenario runs thousands of jobs of one pipeline; retention would delete all
    but the newest of them (and their checkpoints) before they are examined."""
    cluster.env["FLOWBEAT_RUNS_KEPT_PER_PIPELINE"] = RUNS_KEPT
