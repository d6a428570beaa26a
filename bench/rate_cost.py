"""The cost of a rate-limited step against a plain one, side by side in one run, where the
limit does not bind.

    python -m bench.rate_cost [--jobs 200] [--rounds 3] [--json]

One stack (``bench.stack``: the API and one worker on a cluster of their own) serves the chain
bench's job (three no-op steps) twice: as it is, and with a ``rate_limit`` on each step whose
limit no run here reaches (100,000 a second). Each round posts ``--jobs`` of each, one after
the other, in an order that alternates between rounds so that neither side always runs on a
warmer machine, and times them from the first POST to the last job final. A rate-limited step
that finds room costs one Redis script call and no statement; the ratio says what that costs
in steps a second. The issue's bound is 10 %.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from bench.harness import PIPELINE as CHAIN
from bench.harness import PROFILE_YAML, STEPS_PER_JOB, log, on_sigterm
from bench.servers import own_postgres, own_redis
from bench.stack import FlowbeatStack, post_jobs, start_flowbeat, wait_final

RATED = "bench_chain_rated"
RATE_LIMIT = "    rate_limit: {key: bench, limit: 100000, per_s: 1}\n"
CLIENTS = 4
WARMUP_JOBS = 20


def rated_yaml() -> str:
    """The chain's profile with a rate limit on every step."""
    lines = PROFILE_YAML.replace(f"name: {CHAIN}", f"name: {RATED}").splitlines(keepends=True)
    out = []
    for line in lines:
        out.append(line)
        if line.strip().startswith("action:"):
            out.append(RATE_LIMIT)
    return "".join(out)


def _timed(fb: FlowbeatStack, pipeline: str, jobs: int, done_before: int) -> float:
    """Steps a second of ``jobs`` posted to ``pipeline``, from the first POST to the last final."""
    errors: list[str] = []
    began = time.monotonic()
    post_jobs(fb.base_url, fb.key, jobs, CLIENTS, [], errors, pipeline=pipeline)
    if errors:
        raise RuntimeError(f"{len(errors)} POSTs failed, e.g. {errors[0]}")
    wait_final(fb.conn, done_before + jobs, time.monotonic() + 600, fb.dead)
    return jobs * STEPS_PER_JOB / (time.monotonic() - began)


def measure(jobs: int, rounds: int) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {CHAIN: [], RATED: []}
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="flowbeat-ratecost-")))
        pg = stack.enter_context(own_postgres())
        server = stack.enter_context(own_redis(tmp))
        profiles = {CHAIN: PROFILE_YAML, RATED: rated_yaml()}
        fb = start_flowbeat(stack, profiles, server.url, pg.admin_url, tmp)
        done = 0
        for pipeline in (CHAIN, RATED):
            post_jobs(fb.base_url, fb.key, WARMUP_JOBS, CLIENTS, [], [], pipeline=pipeline)
            done += WARMUP_JOBS
            wait_final(fb.conn, done, time.monotonic() + 120, fb.dead)
        for round_ in range(rounds):
            order = (CHAIN, RATED) if round_ % 2 == 0 else (RATED, CHAIN)
            for pipeline in order:
                rates[pipeline].append(_timed(fb, pipeline, jobs, done))
                done += jobs
                log(f"round {round_ + 1} {pipeline}: {rates[pipeline][-1]:.1f} steps/s")
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.rate_cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--jobs", type=int, default=200, help="chain jobs a side a round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, on_sigterm)
    rates = measure(args.jobs, args.rounds)
    plain, rated = statistics.median(rates[CHAIN]), statistics.median(rates[RATED])
    if args.json:
        print(json.dumps({"plain": rates[CHAIN], "rated": rates[RATED], "ratio": rated / plain}))
        return 0
    print(f"{'':28}{'steps/s (median)':>18}   rounds")
    print(f"{'plain step':28}{plain:18.1f}   {', '.join(f'{r:.1f}' for r in rates[CHAIN])}")
    print(
        f"{'rate-limited, not binding':28}{rated:18.1f}   "
        f"{', '.join(f'{r:.1f}' for r in rates[RATED])}"
    )
    print(f"rate-limited / plain: {rated / plain:.3f} (the issue's bound: at least 0.9)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
