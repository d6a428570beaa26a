"""A worker or beat logs at the level it was started with, unless FLOWBEAT_LOG_LEVEL says."""

import logging
from collections.abc import Iterator

import pytest
from celery.signals import setup_logging


@pytest.fixture
def root_kept() -> Iterator[logging.Logger]:
    """The root logger as it was, and settings read afresh from the environment set here."""
    from service.platform.settings import get_settings

    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    get_settings.cache_clear()
    yield root
    get_settings.cache_clear()
    for handler in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(handler)
        handler.close()
    root.setLevel(level)


def test_celerys_loglevel_is_obeyed_when_flowbeats_is_not_set(
    root_kept: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tasks.telemetry  # noqa: F401  connects the handler

    monkeypatch.delenv("FLOWBEAT_LOG_LEVEL", raising=False)
    setup_logging.send(sender=None, loglevel=logging.ERROR, logfile=None, format="", colorize=False)
    assert root_kept.level == logging.ERROR


def test_flowbeats_log_level_wins_over_celerys(
    root_kept: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tasks.telemetry  # noqa: F401  connects the handler

    monkeypatch.setenv("FLOWBEAT_LOG_LEVEL", "DEBUG")
    setup_logging.send(sender=None, loglevel=logging.ERROR, logfile=None, format="", colorize=False)
    assert root_kept.level == logging.DEBUG
