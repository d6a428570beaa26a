"""Schema migrations through Alembic; the schema is never created any other way at run time."""

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine

from service.platform import lifecycle

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    config.set_main_option("file_template", "%%(rev)s_%%(slug)s")
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    """At head, the lifecycle table is written into its trigger as well, since the table
    changes without a migration."""
    command.upgrade(alembic_config(database_url), revision)
    if revision == "head":
        engine = create_engine(database_url)
        try:
            with engine.begin() as connection:
                lifecycle.sync(connection)
        finally:
            engine.dispose()
