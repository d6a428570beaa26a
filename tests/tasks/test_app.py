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
