"""A prefork worker forks its pool processes with what it holds frozen."""

import gc
from collections.abc import Iterator

import pytest
from celery.signals import worker_before_create_process

from tests.conftest import Stack


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


@pytest.mark.usefixtures("unfrozen")
def test_the_objects_a_pool_process_inherits_are_left_out_of_its_collections(
    stack: Stack,
) -> None:
    """What the parent holds is frozen, so a pool process's full collections neither wait for
    a quarter of those objects' count nor write to the pages it shares with its parent."""
    from tasks.app import app  # builds the process-wide app: only once stack is up

    held = len(gc.get_objects())

    worker_before_create_process.send(sender=app)

    assert gc.get_freeze_count() >= held // 2
    assert len(gc.get_objects()) < held // 2


def test_an_app_without_a_broker_url_is_refused_rather_than_pointed_at_amqp_localhost() -> None:
    """Celery's own default broker is ``amqp://guest@localhost:5672``: a command that built its
    app before resolving the embedded default's broker would publish where nobody consumes."""
    from service.platform.settings import Settings
    from tasks.app import create_celery

    with pytest.raises(RuntimeError, match="FLOWBEAT_BROKER_URL"):
        create_celery(Settings(database_url=None, broker_url=None))


@pytest.mark.parametrize("variable", ["CELERY_BROKER_URL", "CELERY_RESULT_BACKEND"])
def test_a_celery_url_in_the_environment_is_refused_since_celery_would_prefer_it(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    """Celery reads these ahead of the broker an app is built with: left set, they would
    send every message past FLOWBEAT_BROKER_URL, to amqp://guest@localhost:5672 or anywhere."""
    from service.platform.settings import Settings
    from tasks.app import create_celery

    monkeypatch.setenv(variable, "amqp://guest@localhost:5672//")

    with pytest.raises(RuntimeError, match=variable):
        create_celery(Settings(broker_url="redis://127.0.0.1:6379/0"))
