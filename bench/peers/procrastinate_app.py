"""Procrastinate's side of ``bench.peers``: async tasks on the psycopg 3 connector, bound to
``BENCH_PEERS_DATABASE_URL`` at import so the workers and the client build the same app.

Procrastinate has no chains or chords: a step defers the next one when it is done (as its
docs show), and the fan-out's gather is deferred by the item that brings the bench's counter
to zero, in the same database."""

import os

import procrastinate

DATABASE_URL = os.environ.get("BENCH_PEERS_DATABASE_URL", "postgresql://postgres@127.0.0.1/x")
FANOUT_TABLE = (
    "CREATE TABLE IF NOT EXISTS bench_fanout "
    "(id int PRIMARY KEY, remaining int NOT NULL, done_at timestamptz)"
)

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=DATABASE_URL))


@app.task(name="bench.c")  # type: ignore[untyped-decorator]
async def step_c(chain: int) -> None:
    return None


@app.task(name="bench.b")  # type: ignore[untyped-decorator]
async def step_b(chain: int) -> None:
    await step_c.defer_async(chain=chain)


@app.task(name="bench.a")  # type: ignore[untyped-decorator]
async def step_a(chain: int) -> None:
    await step_b.defer_async(chain=chain)


@app.task(name="bench.gather")  # type: ignore[untyped-decorator]
async def gather(fanout: int) -> None:
    await app.connector.execute_query_async(
        "UPDATE bench_fanout SET done_at = now() WHERE id = %(id)s", id=fanout
    )


@app.task(name="bench.item")  # type: ignore[untyped-decorator]
async def item(fanout: int) -> None:
    row = await app.connector.execute_query_one_async(
        "UPDATE bench_fanout SET remaining = remaining - 1 WHERE id = %(id)s RETURNING remaining",
        id=fanout,
    )
    if row["remaining"] == 0:
        await gather.defer_async(fanout=fanout)
