"""Counts that depend on a transaction are made when it commits, and only then."""

from collections.abc import Iterator

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from service.engine.runtime import Runtime
from service.platform.metrics import after_commit


@pytest.fixture
def session(runtime: Runtime) -> Iterator[Session]:
    with runtime.sessions() as session:
        yield session


def test_a_count_is_made_once_when_its_transaction_commits(session: Session) -> None:
    counted: list[str] = []
    session.execute(text("SELECT 1"))
    after_commit(session, lambda: counted.append("job"))
    assert counted == []

    session.commit()
    session.execute(text("SELECT 1"))
    session.commit()

    assert counted == ["job"]


def test_a_count_of_a_rolled_back_transaction_is_never_made(session: Session) -> None:
    counted: list[str] = []
    session.execute(text("SELECT 1"))
    after_commit(session, lambda: counted.append("lost"))
    session.rollback()

    session.execute(text("SELECT 1"))
    session.commit()

    assert counted == []


def test_a_rolled_back_savepoint_takes_back_its_own_counts_only(session: Session) -> None:
    counted: list[str] = []
    session.execute(text("SELECT 1"))
    after_commit(session, lambda: counted.append("outer"))
    with pytest.raises(LookupError), session.begin_nested():
        after_commit(session, lambda: counted.append("lost"))
        raise LookupError
    with session.begin_nested():
        after_commit(session, lambda: counted.append("kept"))

    session.commit()

    assert counted == ["outer", "kept"]
