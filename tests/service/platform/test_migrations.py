"""The Alembic history builds exactly the schema the models describe."""

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, text

from service.platform.models import Base
from tests.conftest import Stack
from tests.support.servers import admin_database_url, create_test_database, drop_test_database

_INDEXES = text(
    "SELECT indexname, indexdef FROM pg_indexes"
    " WHERE schemaname = 'public' AND tablename <> 'alembic_version'"
)


def test_migrations_match_the_models(stack: Stack) -> None:
    engine = create_engine(stack.database_url)
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []
    engine.dispose()


def test_every_index_is_the_models_own_to_its_predicate(stack: Stack) -> None:
    """Alembic's comparison matches an index by its name and columns, not by the rows a partial
    index holds: an index built by a migration with another predicate than the model's leaves a
    reader that asks for what the model promises with no index but the whole table (migration
    0058). PostgreSQL prints both definitions the same way when they are the same."""
    with _created_from_the_models() as url:
        assert _indexes(stack.database_url) == _indexes(url)


def _indexes(url: str) -> dict[str, str]:
    engine = create_engine(url)
    with engine.connect() as connection:
        found = {name: definition for name, definition in connection.execute(_INDEXES)}
    engine.dispose()
    return found


@contextmanager
def _created_from_the_models() -> Iterator[str]:
    """A database the models build alone; the step rows' order comes from a sequence that
    only the migrations create."""
    admin, name = admin_database_url(), f"flowbeat_models_{uuid.uuid4().hex[:8]}"
    url = create_test_database(admin, name)
    try:
        engine = create_engine(url)
        with engine.begin() as connection:
            connection.execute(text("CREATE SEQUENCE step_runs_id_seq"))
            Base.metadata.create_all(connection)
        engine.dispose()
        yield url
    finally:
        drop_test_database(admin, name)
