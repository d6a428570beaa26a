"""What a ``pg_notify`` in a durable commit costs when many processes commit at once, side by
side in one run.

    python -m bench.notify_ceiling [--committers 8] [--seconds 4] [--rounds 3] [--json]

Every statement of flowbeat's step path that logs an event notifies the event stream's
listeners (``flowbeat_events``). PostgreSQL queues a transaction's notifications under one
lock for the whole database, taken before its commit record is written and held until the
commit is flushed (``PreCommit_Notify`` in ``async.c``: queue entries must appear in commit
order). So notifying commits do not share disk flushes, as plain commits do: their rate is
capped by one flush at a time, however many workers commit.

On a cluster of its own (``bench.servers``), ``--committers`` threads each commit single
autocommitted inserts of an event-sized row, synchronously, for ``--seconds``, in three ways:
``plain`` (no notification), ``notify`` (the insert's statement notifies, as the step path
does) and ``guarded`` (it notifies only when a table of listeners has a row, here empty: the
cost of asking before notifying). Each round runs the three in a turning order, calibrated
before and after; the figures are commits a second, and each side's ratio to ``plain``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from dataclasses import asdict, dataclass
from functools import partial

import psycopg

from bench.harness import log
from bench.rounds import calibrate, disturbed, in_turn
from bench.servers import own_postgres

SETUP = """
CREATE TABLE events (id bigserial PRIMARY KEY, job_id uuid NOT NULL, seq bigint NOT NULL,
                     kind text NOT NULL, data jsonb NOT NULL, created_at timestamptz NOT NULL);
CREATE TABLE listeners (pid int PRIMARY KEY);
"""
ROW = """INSERT INTO events (job_id, seq, kind, data, created_at)
         VALUES (gen_random_uuid(), 1, 'step.succeeded', '{"attempt": 1, "round": 0}', now())"""
SIDES = {
    "plain": ROW,
    "notify": f"WITH e AS ({ROW} RETURNING job_id) SELECT pg_notify('bench', job_id::text) FROM e",
    "guarded": f"""WITH e AS ({ROW} RETURNING job_id)
        SELECT pg_notify('bench', job_id::text) FROM e
         WHERE EXISTS (SELECT 1 FROM listeners)""",
}


@dataclass
class BenchRound:
    commits_per_s: dict[str, float]
    before: dict[str, float]
    after: dict[str, float]
    disturbed: bool = False


def commit_rate(conninfo: str, statement: str, committers: int, seconds: float) -> float:
    """Commits a second of ``committers`` connections each running ``statement`` in a loop."""
    counts = [0] * committers
    ready = threading.Barrier(committers + 1)

    def commit(slot: int) -> None:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            ready.wait()
            stop = time.monotonic() + seconds
            while time.monotonic() < stop:
                conn.execute(statement)
                counts[slot] += 1

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(committers)]
    for thread in threads:
        thread.start()
    ready.wait()
    for thread in threads:
        thread.join()
    return sum(counts) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--committers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rounds: list[BenchRound] = []
    with own_postgres() as pg:
        conninfo = pg.conninfo()
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(SETUP)
        rate = partial(commit_rate, conninfo, committers=args.committers, seconds=args.seconds)
        for number in range(args.rounds):
            before = calibrate()
            rates = in_turn(number, {side: partial(rate, sql) for side, sql in SIDES.items()})
            rounds.append(BenchRound(rates, before, calibrate()))
            log(f"round {number + 1}: " + ", ".join(f"{s} {r:,.0f}/s" for s, r in rates.items()))
    best = min(min(r.before["loop_ms"], r.after["loop_ms"]) for r in rounds)
    for r in rounds:
        r.disturbed = disturbed(r.before, r.after, best)
    report(rounds, args)


def report(rounds: list[BenchRound], args: argparse.Namespace) -> None:
    clean = [r for r in rounds if not r.disturbed] or rounds
    ratios = {
        side: statistics.median(r.commits_per_s[side] / r.commits_per_s["plain"] for r in clean)
        for side in SIDES
    }
    if args.json:
        print(json.dumps({"rounds": [asdict(r) for r in rounds], "median_ratio": ratios}))
        return
    print(f"\n{args.committers} committers, synchronous commits, {args.seconds:g} s a side")
    for number, r in enumerate(rounds, 1):
        flag = "  DISTURBED" if r.disturbed else ""
        sides = "  ".join(f"{s} {rate:7,.0f}/s" for s, rate in r.commits_per_s.items())
        calibration = f"loop {r.before['loop_ms']:.1f}/{r.after['loop_ms']:.1f} ms"
        print(f"  round {number}: {sides}  ({calibration}){flag}")
    print(
        "median ratio to plain, clean rounds: "
        + ", ".join(f"{s} {v:.2f}" for s, v in ratios.items())
    )


if __name__ == "__main__":
    main()
