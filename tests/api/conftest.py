"""API fixtures on the real stack of ``tests/conftest.py``: one app, keys made per test."""

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from service.engine.runtime import Runtime
from service.platform.auth import create_api_key
from service.platform.db import unit_of_work
from service.platform.models import JobRow
from service.platform.settings import Settings
from tests.conftest import Stack
from tests.support.apps import api_client

GREET = """\
name: greet
params:
  who: {type: string, required: true}
  count: {type: integer, default: 1}
steps:
  - id: first
    action: noop
    with: {who: "${{ params.who }}"}
  - id: second
    action: noop
    depends_on: [first]
"""

TENANTS = """\
name: tenants
params:
  tenant: {type: string, required: true}
concurrency: {key: "${{ params.tenant }}", limit: 1}
steps:
  - id: only
    action: noop
"""

SEARCH = """\
name: {name}
params:
  query: {{type: string, required: true}}
dedupe: {{key: "${{{{ params.query }}}}", window_s: 3600, on_duplicate: {on_duplicate}}}
steps:
  - id: only
    action: noop
"""

MAX_BODY = 20_000
CLOSED_PORT_REDIS = "redis://127.0.0.1:1/0"
CLOSED_PORT_DATABASE = "postgresql+psycopg://postgres@127.0.0.1:1/flowbeat"

KeyFactory = Callable[..., str]


@pytest.fixture(scope="session")
def profiles_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("profiles")
    (path / "greet.yaml").write_text(GREET, encoding="utf-8")
    (path / "tenants.yaml").write_text(TENANTS, encoding="utf-8")
    for name, on_duplicate in (("search", "return"), ("search-once", "reject")):
        profile = SEARCH.format(name=name, on_duplicate=on_duplicate)
        (path / f"{name}.yaml").write_text(profile, encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def settings(stack: Stack, profiles_dir: Path) -> Settings:
    return Settings(
        database_url=stack.database_url,
        broker_url=stack.broker_url,
        profiles_dir=profiles_dir,
        lease_s=2,
        max_body_bytes=MAX_BODY,
    )


@pytest.fixture(scope="session")
def runtime(settings: Settings) -> Runtime:
    return Runtime.start(settings)


@pytest.fixture(scope="session")
def client(settings: Settings, runtime: Runtime) -> Iterator[TestClient]:
    with api_client(settings, runtime) as test_client:
        yield test_client


@pytest.fixture
def broken_broker_client(settings: Settings, runtime: Runtime) -> Iterator[TestClient]:
    bad = settings.model_copy(update={"broker_url": CLOSED_PORT_REDIS})
    with api_client(bad, runtime) as test_client:
        yield test_client


@pytest.fixture
def broken_database_client(settings: Settings) -> Iterator[TestClient]:
    bad = settings.model_copy(update={"database_url": CLOSED_PORT_DATABASE})
    with api_client(bad) as test_client:
        yield test_client


@pytest.fixture
def make_key(runtime: Runtime) -> KeyFactory:
    """A key for a fresh owner, unless ``owner`` is given: tests do not see each other's jobs."""

    def make(*scopes: str, owner: str | None = None) -> str:
        with unit_of_work(runtime.sessions) as session:
            token, _ = create_api_key(
                session, owner=owner or f"owner-{uuid.uuid4().hex[:8]}", scopes=scopes
            )
        return token

    return make


@pytest.fixture
def writer(make_key: KeyFactory) -> dict[str, str]:
    return {"Authorization": f"Bearer {make_key('write')}"}


@pytest.fixture
def job_count(runtime: Runtime) -> Callable[[], int]:
    def count() -> int:
        with runtime.sessions() as session:
            return session.scalar(select(func.count()).select_from(JobRow)) or 0

    return count


@pytest.fixture
def broker(settings: Settings) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.require_broker_url())
    try:
        yield client
    finally:
        client.close()
