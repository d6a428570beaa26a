"""The signing secret the alert tests' rules name, from the environment source."""

import pytest

from tests.service.alerts.support import SECRET, SECRET_NAME


@pytest.fixture(autouse=True)
def _signing_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(f"FLOWBEAT_SECRET_{SECRET_NAME}", SECRET)
