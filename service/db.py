"""Engine and session factory. The caller of a unit of work owns its transaction."""

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session, sessionmaker


def make_engine(url: str, *, pool_size: int = 5) -> Engine:
    """No pre-ping: a dead connection fails one unit of work, which callers already retry (tasks)
    or answer with 503 (the API), and SQLAlchemy then drops the whole stale pool."""
    return create_engine(url, pool_size=pool_size, max_overflow=10)


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def unit_of_work(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One transaction: commit on success, roll back on any error."""
    with factory() as session, session.begin():
        yield session


def ping(factory: sessionmaker[Session]) -> None:
    """Raise unless the database answers a trivial query."""
    with factory() as session:
        session.execute(text("SELECT 1"))
