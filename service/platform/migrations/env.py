"""Alembic environment: the URL comes from the caller's config, else from FLOWBEAT_DATABASE_URL."""

from alembic import context
from sqlalchemy import create_engine

from service.platform.models import Base
from service.platform.settings import Settings

config = context.config
url = config.get_main_option("sqlalchemy.url") or Settings().require_database_url()

engine = create_engine(url)
with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=Base.metadata, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
