"""A Runtime on the test stack, for service functions that talk to PostgreSQL."""

from collections.abc import Iterator

import pytest

from tests.conftest import Stack


@pytest.fixture(scope="session")
def runtime(stack: Stack) -> Iterator[object]:
    from service.runtime import Runtime
    from service.settings import get_settings

    rt = Runtime.start(get_settings())
    yield rt
    rt.sessions.kw["bind"].dispose()
