"""flowbeat side by side with the queues and workflow engines users would pick instead.

    make bench-peers            (builds .venv-peers, then runs this at the default scale)
    python -m bench.peers [--chains 1000] [--fanout 10000] [--rounds 3] [--quick] [--json]

One run, one machine, the same work on every side, each side configured as its docs advise
for throughput and running as many steps at once (``--concurrency``, 2 by default):

- 1,000 jobs of a 3-step chain of no-op steps, submitted at once: steps/s (3N over first
  submit .. last job done), each job's latency from its submission to its last step's end
  (p50, p99), CPU per job by process (the run's Redis server as broker, the database's
  backends, the workers, an API or server, the client) and the peak PSS of the side's own
  workers and servers;
- one fan-out of 10,000 no-op items with a gather: items/s.

Sides: raw Celery (``bench.raw_app``: ``chain`` and ``chord``), flowbeat (the API and a
worker, every step persisted in PostgreSQL), the floor under flowbeat's shape (``sides.floor``:
each job POSTed and stored with one ``INSERT``, then claimed and its three steps checkpointed
with one statement each by a bare Celery task, ``bench.floor_app``; no fan-out),
Dramatiq (Redis broker, ``pipeline`` and
``group`` with a completion callback), Procrastinate (PostgreSQL) and Prefect 3 (a local
``prefect server``). The peers run as subprocesses in ``.venv-peers`` (their own lock,
``bench/peers/requirements.lock``), never in CI's install. The order of the sides rotates
round by round; the machine is calibrated before and after each round, and a disturbed round
is left out of the medians (``bench.rounds``). docs/peers.md says how each peer is set up.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.harness import DEFAULT_ADMIN_DB, WORKER_CONCURRENCY, log, on_sigterm
from bench.peers.measure import SideResult
from bench.peers.report import print_report, summary
from bench.peers.sides import (
    Run,
    floor,
    flowbeat,
    peer,
    peers_ready,
    private_redis,
    raw_celery,
)
from bench.rounds import calibrate, disturbed

SIDES = ("raw celery", "flowbeat", "floor", "dramatiq", "procrastinate", "prefect")


def side_runners(run: Run, lanes: int) -> dict[str, Callable[[], SideResult]]:
    return {
        "raw celery": lambda: raw_celery(run),
        "flowbeat": lambda: flowbeat(run, lanes),
        "floor": lambda: floor(run),
        "dramatiq": lambda: peer("dramatiq_side", run, 3),
        "procrastinate": lambda: peer("procrastinate_side", run, None),
        "prefect": lambda: peer("prefect_side", run, None),
    }


def order(number: int, sides: list[str]) -> list[str]:
    """Round ``number``'s order: rotated by one each round, reversed every other round, so no
    side always runs first, last, or next to the same neighbour."""
    shift = number % len(sides)
    rotated = sides[shift:] + sides[:shift]
    return rotated[::-1] if number % 2 else rotated


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.peers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--chains", type=int, default=1000, help="3-step chains per side")
    parser.add_argument("--fanout", type=int, default=10_000, help="items in the fan-out")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, the order rotating")
    parser.add_argument("--warmup", type=int, default=20, help="untimed chains per side")
    parser.add_argument("--lanes", type=int, default=2 * WORKER_CONCURRENCY, help="flowbeat's")
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds a side's chains may take at most"
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=60.0,
        help="seconds Prefect's runners start flows for: its figures are then of the flows "
        "that ran (at about 1.5 flows/s here, 1,000 would take over ten minutes a round)",
    )
    parser.add_argument(
        "--fanout-timeout",
        type=float,
        default=60.0,
        help="seconds for a fan-out; one still running is reported as not finished, with "
        "the rate of the items done by then",
    )
    parser.add_argument("--only", action="append", choices=SIDES, help="run these sides only")
    parser.add_argument(
        "--quick", action="store_true", help="200 chains, 1,000 items, one round: for iterating"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--save", type=Path, help="also write the figures as JSON to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.chains, args.fanout, args.rounds = 200, 1000, 1
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sides = [side for side in SIDES if not args.only or side in args.only]
    if set(sides) - {"raw celery", "flowbeat", "floor"}:
        peers_ready()
    signal.signal(signal.SIGTERM, on_sigterm)
    rounds: list[dict[str, Any]] = []
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="flowbeat-peers-")))
        redis_base, redis_pid = stack.enter_context(private_redis(tmp))
        run = Run(
            chains=args.chains,
            fanout=args.fanout,
            warmup=args.warmup,
            concurrency=WORKER_CONCURRENCY,
            redis_base=redis_base,
            redis_pid=redis_pid,
            admin_db=os.environ.get("FLOWBEAT_TEST_DATABASE_URL", DEFAULT_ADMIN_DB),
            tmp=tmp,
            timeout_s=args.timeout,
            budget_s=args.budget,
            fanout_timeout_s=args.fanout_timeout,
        )
        runners = side_runners(run, args.lanes)
        for number in range(args.rounds):
            log(f"round {number + 1} of {args.rounds}: {', '.join(order(number, sides))}")
            before = calibrate()
            results = {side: runners[side]() for side in order(number, sides)}
            rounds.append({"before": before, "after": calibrate(), "sides": results})
    best = min(min(r["before"]["loop_ms"], r["after"]["loop_ms"]) for r in rounds)
    for r in rounds:
        r["disturbed"] = disturbed(r["before"], r["after"], best)
    figures = summary(rounds, sides)
    if args.save:
        args.save.write_text(json.dumps(_jsonable(args, rounds, figures), indent=2))
    if args.json:
        print(json.dumps(_jsonable(args, rounds, figures), indent=2))
    else:
        print_report(args, rounds, figures)
    return 0


def _jsonable(
    args: argparse.Namespace, rounds: list[dict[str, Any]], figures: dict[str, Any]
) -> dict[str, Any]:
    return {
        "chains": args.chains,
        "fanout": args.fanout,
        "concurrency": WORKER_CONCURRENCY,
        "summary": figures,
        "rounds": [
            {
                "before": r["before"],
                "after": r["after"],
                "disturbed": r["disturbed"],
                "sides": {name: asdict(side) for name, side in r["sides"].items()},
            }
            for r in rounds
        ],
    }


if __name__ == "__main__":
    sys.exit(main())
