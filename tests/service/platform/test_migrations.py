"""The Alembic history builds exactly the schema the models describe."""

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine

from service.platform.models import Base
from tests.conftest import Stack


def test_migrations_match_the_models(stack: Stack) -> None:
    engine = create_engine(stack.database_url)
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []
    engine.dispose()
