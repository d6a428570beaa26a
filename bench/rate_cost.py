"""The cost of a rate-limited step against a plain one, side by side in one run, where the
limit does not bind.

    python -m bench.rate_cost [--jobs 200] [--rounds 3] [--json]

One stack (``bench.stack``: the API and one worker on a cluster of their own) serves the chain
bench's job (three no-op steps) twice: as it is, and with a ``rate_limit`` on each step whose
limit no run here reaches (100,000 a second). Each round posts ``--jobs`` of each, one after
the other, in an order that alternates between rounds so that neither side always runs on a
warmer machine, and times them from the first POST to the last job final, with the CPU the
API, the worker, PostgreSQL and Redis spent meanwhile. A rate-limited step
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
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.cpu import CpuMeter
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


@dataclass(frozen=True)
class Side:
    steps_per_s: float
    cpu_ms_by_part: dict[str, float]
    """The API's, the worker's, PostgreSQL's and Redis's CPU a step, which swings much less
    with the rest of the machine than the rate does."""

    @property
    def cpu_ms_per_step(self) -> float:
        return sum(self.cpu_ms_by_part.values())


def _timed(fb: FlowbeatStack, redis_pid: int, pipeline: str, jobs: int, done: int) -> Side:
    """``jobs`` posted to ``pipeline``, from the first POST to the last final."""
    errors: list[str] = []
    roots = {"api": [fb.api.pid], "workers": [w.pid for w in fb.workers], "redis": [redis_pid]}
    meter = CpuMeter(roots, fb.conn)
    meter.start()
    began = time.monotonic()
    post_jobs(fb.base_url, fb.key, jobs, CLIENTS, [], errors, pipeline=pipeline)
    if errors:
        raise RuntimeError(f"{len(errors)} POSTs failed, e.g. {errors[0]}")
    wait_final(fb.conn, done + jobs, time.monotonic() + 600, fb.dead)
    elapsed = time.monotonic() - began
    steps = jobs * STEPS_PER_JOB
    cpu = {part: s * 1000 / steps for part, s in meter.stop().items() if part != "client"}
    return Side(steps / elapsed, cpu)


def measure(jobs: int, rounds: int) -> dict[str, list[Side]]:
    rates: dict[str, list[Side]] = {CHAIN: [], RATED: []}
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
                side = _timed(fb, server.pid, pipeline, jobs, done)
                rates[pipeline].append(side)
                done += jobs
                log(
                    f"round {round_ + 1} {pipeline}: {side.steps_per_s:.1f} steps/s, "
                    f"{side.cpu_ms_per_step:.2f} ms CPU a step"
                )
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
    sides = measure(args.jobs, args.rounds)
    if args.json:
        print(json.dumps({name: [asdict(side) for side in runs] for name, runs in sides.items()}))
        return 0
    print(f"{'':28}{'steps/s':>9}{'CPU ms a step':>15}   (medians of {args.rounds} rounds)")
    for label, name in (("plain step", CHAIN), ("rate-limited, not binding", RATED)):
        rate = statistics.median(s.steps_per_s for s in sides[name])
        cpu = statistics.median(s.cpu_ms_per_step for s in sides[name])
        parts = {
            part: statistics.median(s.cpu_ms_by_part[part] for s in sides[name])
            for part in sides[name][0].cpu_ms_by_part
        }
        by_part = ", ".join(f"{part} {ms:.2f}" for part, ms in parts.items())
        print(f"{label:28}{rate:9.1f}{cpu:15.2f}   ({by_part})")
    pairs = list(zip(sides[RATED], sides[CHAIN], strict=True))
    cpu_ratio = [r.cpu_ms_per_step / p.cpu_ms_per_step for r, p in pairs]
    rate_ratio = [r.steps_per_s / p.steps_per_s for r, p in pairs]
    print(
        f"rate-limited / plain, round by round: CPU a step {_listed(cpu_ratio)} "
        f"(median {statistics.median(cpu_ratio):.3f}); steps/s {_listed(rate_ratio)} "
        f"(median {statistics.median(rate_ratio):.3f}); the issue's bound: within 10 %"
    )
    return 0


def _listed(values: list[float]) -> str:
    return ", ".join(f"{v:.3f}" for v in values)


if __name__ == "__main__":
    raise SystemExit(main())
