"""Engine and session factory. The caller of a unit of work owns its transaction."""

import select
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from sqlalchemy import Engine, create_engine, event, exc, make_url, text
from sqlalchemy.orm import Session, sessionmaker

from service.platform.settings import Settings

NETWORK_TIMEOUT_S = 10.0
"""How long a connection attempt, or a statement's unacknowledged packets, may wait. Without a
bound a statement sent while a partition drops packets waits for the kernel's retransmissions,
for minutes and past the heal, and so does a connection attempt; with one either fails within
seconds, and the callers' retries take over. No keepalives: an idle connection that a short
partition cut off is whole again once it heals, where keepalives would have killed it for the
next statement to find (a checkpoint, after a whole attempt). A value in the URL wins."""


def network_timeout_s(lease_s: float) -> float:
    """For the engine's connections: a lease renewal fails well within the lease it renews, and
    the next one goes out on a fresh connection in time."""
    return min(NETWORK_TIMEOUT_S, lease_s / 3)


KEEPALIVES: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
}
"""For a connection that only listens: it sends nothing, so only probes find its server gone."""


def connect_kwargs(url: str, pooled: bool, timeout_s: float = NETWORK_TIMEOUT_S) -> dict[str, Any]:
    """psycopg prepares a statement on the server once a connection has run it five times;
    behind a transaction pooler the next transaction may find another server connection,
    without it (PgBouncer before 1.21 keeps none), so a pooled connection prepares nothing.
    libpq takes a ``connect_timeout`` of whole seconds, two at the least."""
    network = {
        "connect_timeout": max(2, round(timeout_s)),
        "tcp_user_timeout": int(timeout_s * 1000),
    }
    given = make_url(url).query
    kwargs = {name: value for name, value in network.items() if name not in given}
    return {**kwargs, "prepare_threshold": None} if pooled else kwargs


def make_engine(
    url: str, *, pool_size: int = 5, pooled: bool = False, timeout_s: float = NETWORK_TIMEOUT_S
) -> Engine:
    """No pre-ping round trip: a connection its server hung up on is replaced at checkout
    (``hung_up``); one that dies later fails one unit of work, which callers already retry
    (tasks) or answer with 503 (the API), and SQLAlchemy then drops the whole stale pool."""
    engine = create_engine(
        url,
        pool_size=pool_size,
        max_overflow=10,
        connect_args=connect_kwargs(url, pooled, timeout_s),
    )
    event.listen(engine, "checkout", _refuse_hung_up)
    return engine


def _refuse_hung_up(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
    if isinstance(dbapi_connection, psycopg.Connection) and hung_up(dbapi_connection):
        raise exc.DisconnectionError("the server closed this idle connection")


_UNASKED_READS = 3
"""A hang-up is a last message, then the end of the stream: the first read takes the message,
the next finds the end. Harmless bytes (the tail of a TLS record) are gone after one read."""


def hung_up(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server has closed this idle connection, found without a round trip.

    A server that stops or restarts ends each backend with a last message and closes its
    socket; an idle connection learns of it only when its next statement fails. For a
    checkpoint that failure costs a whole attempt of the step's body, run again, so its socket
    is looked at first: readable while idle means the server spoke unasked, and reading what
    it said tells a hang-up from anything harmless."""
    if conn.closed or conn.broken:
        return True
    try:
        poller = select.poll()
        poller.register(conn.fileno(), select.POLLIN)
        for _ in range(_UNASKED_READS):
            if not poller.poll(0):
                return conn.pgconn.status != psycopg.pq.ConnStatus.OK
            conn.pgconn.consume_input()
    except (OSError, ValueError, psycopg.OperationalError):
        return True
    return True


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def sessions_of(settings: Settings) -> sessionmaker[Session]:
    """Sessions on the configured database, for a command that is not a long-lived process."""
    url = settings.require_database_url()
    return make_session_factory(make_engine(url, pooled=settings.database_pooled))


@contextmanager
def unit_of_work(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One transaction: commit on success, roll back on any error."""
    with factory() as session, session.begin():
        yield session


def custom_plans(session: Session) -> None:
    """Plan the rest of the transaction's statements for their own parameters. psycopg
    prepares a statement once a connection has run it five times, and PostgreSQL may then
    settle on one generic plan for every parameter, blind to how many rows a value matches:
    for a label ten jobs in a million carry, that plan walks every job (0.7 s) where the
    label's own plan reads its index (13 ms; ``bench.label_filter``). ``SET LOCAL`` ends with
    the transaction, so it is safe behind a transaction pooler too."""
    session.execute(text("SET LOCAL plan_cache_mode = force_custom_plan"))


def driver(session: Session) -> psycopg.Connection[Any]:
    """The session's own psycopg connection, inside the session's transaction.

    Statements run on every request go through it: psycopg executes a constant statement for
    a fraction of what SQLAlchemy's execution and result layers cost, and whoever owns the
    session still commits or rolls back everything together.
    """
    conn = session.connection().connection.driver_connection
    if not isinstance(conn, psycopg.Connection):
        raise TypeError(f"expected a psycopg connection, got {type(conn).__name__}")
    return conn


def autocommit(session: Session) -> None:
    """Let each statement of the session's next transaction commit on its own.

    For a caller whose only write is a single statement, atomic by itself, such as accepting a
    job: it saves the BEGIN and COMMIT round trips and SQLAlchemy's commit, which the API pays
    on every job. A session already in a transaction (one that just looked up an API key) is
    left in it, and its caller's commit covers the write as before. The connection goes back to
    the pool transactional again.
    """
    if not session.in_transaction():
        session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})


def libpq_url(url: str) -> str:
    """A SQLAlchemy URL (``postgresql+psycopg://``) as libpq reads it."""
    return make_url(url).set(drivername="postgresql").render_as_string(False)


def ping(factory: sessionmaker[Session]) -> None:
    """Raise unless the database answers a trivial query."""
    with factory() as session:
        session.execute(text("SELECT 1"))


class DirectConnections:
    """One autocommitted psycopg connection per thread, for the statements every step runs.

    A step's claim and checkpoint are single statements that need neither a transaction nor
    the ORM; going around SQLAlchemy's pool and result machinery roughly halves their client
    CPU. A connection that broke is replaced on the next use.

    ``synchronous_commit=False`` is for claims only: a commit then does not wait for the
    disk, and a PostgreSQL crash can at worst forget that a step started, which runs it again.
    A checkpoint is committed after its claim, and its synchronous commit flushes both.
    Behind a transaction pooler (``pooled``) a session setting would stay on the server
    connection for other clients, so claims commit synchronously there.
    """

    def __init__(
        self,
        url: str,
        *,
        synchronous_commit: bool = True,
        pooled: bool = False,
        timeout_s: float = NETWORK_TIMEOUT_S,
    ) -> None:
        self._conninfo = libpq_url(url)
        self._synchronous_commit = synchronous_commit or pooled
        self._kwargs = connect_kwargs(url, pooled, timeout_s)
        self._local = threading.local()

    @contextmanager
    def connect(self) -> Iterator[psycopg.Connection[Any]]:
        conn: psycopg.Connection[Any] | None = getattr(self._local, "conn", None)
        if conn is None or hung_up(conn):
            if conn is not None:
                conn.close()
            conn = self._local.conn = psycopg.connect(
                self._conninfo, autocommit=True, **self._kwargs
            )
            if not self._synchronous_commit:
                conn.execute("SET synchronous_commit = off")
        yield conn
