"""The chaos suite drives the same real processes as the end-to-end tests, with their fixtures."""

from tests.e2e.conftest import browser, client, cluster, shared_worker

__all__ = ["browser", "client", "cluster", "shared_worker"]
