"""``python -m tests.support.embedded_cli ARGS``: the flowbeat command in the embedded default,
whose servers are the test stack's (named by ``FLOWBEAT_TEST_EMBEDDED_*``) rather than ones
started from the wheels: what matters to these tests is which broker a command publishes to once
it resolved the embedded settings, and the stack's Redis DB is private to this test run."""

import os
from pathlib import Path

import service.platform.embedded
from service.cli import main
from service.platform.embedded import EmbeddedServers

DATABASE_ENV = "FLOWBEAT_TEST_EMBEDDED_DATABASE_URL"
BROKER_ENV = "FLOWBEAT_TEST_EMBEDDED_BROKER_URL"


def _stack_servers(data_dir: Path) -> EmbeddedServers:
    return EmbeddedServers(os.environ[DATABASE_ENV], os.environ[BROKER_ENV])


if __name__ == "__main__":
    service.platform.embedded.start_embedded = _stack_servers
    main()
