"""Rounds run alternately, disturbed ones set aside, and the machine's pace: calibration,
background load, and the paces recorded per CPU model and interpreter."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

from bench.harness import A, B
from bench.stack import FlowbeatResult


@dataclass
class RawResult:
    chains: int
    tasks: int
    submit_s: float
    wall_s: float
    tasks_per_s: float
    cpu_ms_per_chain: dict[str, float] = field(default_factory=dict)


@dataclass
class Round:
    raw: RawResult | None
    fb: FlowbeatResult | None
    before: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    disturbed: bool = False
    base: FlowbeatResult | None = None
    """flowbeat on the base revision's code (``bench.chain_throughput --base``)."""

    @property
    def ratio(self) -> float | None:
        return self.fb.steps_per_s / self.raw.tasks_per_s if self.raw and self.fb else None

    @property
    def base_ratio(self) -> float | None:
        """The base's persisted steps/s over raw Celery's tasks/s."""
        return self.base.steps_per_s / self.raw.tasks_per_s if self.raw and self.base else None

    @property
    def over_base(self) -> float | None:
        """flowbeat's persisted steps/s over the base's: above 1, the head is faster."""
        return self.fb.steps_per_s / self.base.steps_per_s if self.fb and self.base else None

    @property
    def cpu_ratio(self) -> float | None:
        """Raw Celery's CPU per chain over flowbeat's per job: the throughput ratio the two
        sides would reach if CPU were the only limit, however busy the machine was."""
        if not (self.raw and self.fb and self.raw.cpu_ms_per_chain and self.fb.cpu_ms_per_job):
            return None
        return sum(self.raw.cpu_ms_per_chain.values()) / sum(self.fb.cpu_ms_per_job.values())

    @property
    def cpu_over_base(self) -> float | None:
        """The base's CPU per job over flowbeat's: ``over_base`` if CPU were the only limit."""
        if not (self.base and self.fb and self.base.cpu_ms_per_job and self.fb.cpu_ms_per_job):
            return None
        return sum(self.base.cpu_ms_per_job.values()) / sum(self.fb.cpu_ms_per_job.values())


def run_round(
    number: int,
    raw: Callable[[], RawResult] | None,
    fb: Callable[[], FlowbeatResult] | None,
    base: Callable[[], FlowbeatResult] | None = None,
) -> Round:
    """The sides given, in the order raw, flowbeat, base turned by one each round
    (``in_turn``; with two sides, the second runs first in odd rounds), so a machine that
    speeds up or slows down during the run favours none. The machine is calibrated before and
    after the round."""
    before = calibrate()
    sides: dict[str, Callable[[], RawResult | FlowbeatResult]] = {
        name: side for name, side in (("raw", raw), ("fb", fb), ("base", base)) if side
    }
    measured = in_turn(number, sides)
    a, b, c = (measured.get(name) for name in ("raw", "fb", "base"))
    return Round(
        a if isinstance(a, RawResult) else None,
        b if isinstance(b, FlowbeatResult) else None,
        before,
        calibrate(),
        base=c if isinstance(c, FlowbeatResult) else None,
    )


def alternate(number: int, side_a: Callable[[], A], side_b: Callable[[], B]) -> tuple[A, B]:
    """Both sides of round ``number``, B first in odd rounds."""
    if number % 2:
        b = side_b()
        return side_a(), b
    a = side_a()
    return a, side_b()


def in_turn(number: int, sides: dict[str, Callable[[], A]]) -> dict[str, A]:
    """``alternate`` for any number of sides: every side's share of round ``number``, their
    order turned by one each round so that none always runs first or after the same one."""
    names = list(sides)
    shift = number % len(names)
    return {name: sides[name]() for name in names[shift:] + names[:shift]}


DISTURBED_SLOWDOWN = 1.25


def mark_disturbed(rounds: list[Round]) -> None:
    """A round whose calibration loop ran more than ``DISTURBED_SLOWDOWN`` times slower, before
    or after it, than the fastest loop of the run (a throttled VM), or with something else
    keeping more than ``BUSY_CORES_DISTURBED`` of a core busy while the bench was idle (a
    shared machine), is reported, but left out of the median."""
    if not rounds:
        return
    best = min(min(r.before["loop_ms"], r.after["loop_ms"]) for r in rounds)
    for r in rounds:
        r.disturbed = disturbed(r.before, r.after, best)


def disturbed(before: dict[str, float], after: dict[str, float], best_loop_ms: float) -> bool:
    """One round's calibrations against the fastest loop of its run (``mark_disturbed``)."""
    slowest = max(before["loop_ms"], after["loop_ms"])
    busy = max(before["background_cores"], after["background_cores"])
    return slowest > DISTURBED_SLOWDOWN * best_loop_ms or busy > BUSY_CORES_DISTURBED


def median_round(rounds: list[Round]) -> Round | None:
    """The round whose ratio is the median (the lower middle one for an even count) of the
    undisturbed rounds, or of all when every round was disturbed."""
    clean = [r for r in rounds if not r.disturbed] or rounds
    if not clean:
        return None
    ranked = sorted(
        clean,
        key=lambda r: (
            r.ratio if r.ratio is not None else 0.0,
            r.raw.tasks_per_s if r.raw else 0.0,
            r.fb.steps_per_s if r.fb else 0.0,
        ),
    )
    return ranked[(len(ranked) - 1) // 2]


CALIBRATION_LOOP = 2_000_000
TARGET_RATIO = 0.90


BACKGROUND_SAMPLE_S = 1.0
BUSY_CORES_DISTURBED = 0.3


def _cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot, from /proc/stat (0, 0 where there is none)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields[:8]) - idle, sum(fields[:8])


def background_cores() -> float:
    """Cores kept busy by something else while this bench is idle, over a short sample."""
    busy0, total0 = _cpu_jiffies()
    time.sleep(BACKGROUND_SAMPLE_S)
    busy1, total1 = _cpu_jiffies()
    if total1 == total0:
        return 0.0
    return (busy1 - busy0) / (total1 - total0) * (os.cpu_count() or 1)


def calibrate() -> dict[str, float]:
    """How fast this machine runs a fixed pure-Python loop right now (best of three), how
    many cores something else keeps busy, and the load: the VM's speed drifts and the
    machine may be shared, so a run is read against its own calibration."""
    times = []
    for _ in range(3):
        started = time.perf_counter()
        sum(i * i for i in range(CALIBRATION_LOOP))
        times.append(time.perf_counter() - started)
    return {
        "loop_ms": min(times) * 1000,
        "background_cores": background_cores(),
        "load_1m": os.getloadavg()[0],
    }


PACE_FILE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flowbeat-bench.json"
"""The fastest calibration loop each kind of machine and interpreter has run, kept between runs."""
SHIPPED_PACES = Path(__file__).with_name("paces.json")
"""The fastest loops measured on the machines these benches were run on, for a machine that
has no history of its own: every session here starts on a fresh VM, so its first run would
otherwise become the reference however slow the VM was running then."""


def machine_pace(rounds_loop_ms: list[float]) -> dict[str, float]:
    """This run's fastest calibration loop against the fastest that any earlier run on this
    kind of machine (CPU model and count), with this interpreter, recorded in ``PACE_FILE`` or
    ``SHIPPED_PACES``; the run's own when none did.

    A round is marked disturbed against the run's own fastest loop, so a run that is slow
    from start to end has no disturbed round: only this says it ran on a throttled machine.
    """
    key = pace_key()
    known = _paces(PACE_FILE)
    run_ms = min(rounds_loop_ms)
    fastest = min(
        [run_ms] + [paces[key] for paces in (known, _paces(SHIPPED_PACES)) if key in paces]
    )
    with suppress(OSError):
        PACE_FILE.parent.mkdir(parents=True, exist_ok=True)
        PACE_FILE.write_text(json.dumps({**known, key: fastest}, indent=2))
    return {"run_loop_ms": run_ms, "fastest_loop_ms": fastest, "slowdown": run_ms / fastest}


def pace_key() -> str:
    return f"{_cpu_model()}, {os.cpu_count()} cpus: {interpreter()}"


def _cpu_model() -> str:
    with suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() == "model name":
                return value.strip()
    return platform.processor() or platform.machine()


def _paces(path: Path) -> dict[str, float]:
    try:
        found: dict[str, float] = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found


def pace_line(pace: dict[str, float]) -> str:
    slowdown = pace["slowdown"]
    if slowdown > DISTURBED_SLOWDOWN:
        verdict = "a throttled machine: a figure that needs its usual speed is not clean"
    elif slowdown <= 1:
        verdict = "the fastest this kind of machine has run"
    else:
        verdict = "within the recorded pace"
    return (
        f"  machine pace: the run's fastest calibration loop {pace['run_loop_ms']:.0f} ms, "
        f"{slowdown:.2f} times the fastest recorded for this kind of machine and interpreter "
        f"({pace['fastest_loop_ms']:.0f} ms; {SHIPPED_PACES.name} and {PACE_FILE}): {verdict}"
    )


def interpreter() -> str:
    """Every figure here moves by a tenth or more with the interpreter's build: Debian's
    python3.11 and the image's python:3.11-slim are built with PGO and LTO, a default pyenv
    build with neither, and with libpython as a shared library."""
    return (
        f"{platform.python_implementation()} {platform.python_version()}, "
        f"{os.path.realpath(sys.executable)}, libpython {_libpython()}"
    )


def _libpython() -> str:
    """Linked in or loaded as a shared library: what the process maps, not what sysconfig
    says (Debian builds the shared library too, but links its interpreter statically)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "unknown"
    return "shared" if "libpython" in maps else "static"


def _round_line(r: Round) -> str:
    if r.base:
        figures = _three_sides(r)
    elif r.raw and r.fb and r.ratio is not None:
        figures = f"{r.raw.tasks_per_s:.0f}/{r.fb.steps_per_s:.0f}={r.ratio:.2f}"
    else:
        figures = "-"
    machine = (
        f"loop {r.before['loop_ms']:.0f}/{r.after['loop_ms']:.0f} ms, "
        f"background {r.before['background_cores']:.2f}/{r.after['background_cores']:.2f} "
        f"cores, load {r.before['load_1m']:.2f}/{r.after['load_1m']:.2f}"
    )
    cpu = f", CPU ratio {r.cpu_ratio:.2f}" if r.cpu_ratio is not None else ""
    return f"    {figures}{cpu} ({machine}){' DISTURBED' if r.disturbed else ''}"


def _three_sides(r: Round) -> str:
    """A round with a base: each side's rate (raw tasks/s, persisted steps/s), then the ratios
    of the sides that ran, and the base's CPU a job over flowbeat's."""
    rates = {
        "raw": r.raw.tasks_per_s if r.raw else None,
        "flowbeat": r.fb.steps_per_s if r.fb else None,
        "base": r.base.steps_per_s if r.base else None,
    }
    ratios = {"flowbeat/raw": r.ratio, "base/raw": r.base_ratio, "flowbeat/base": r.over_base}
    shown = "/".join(name for name, rate in rates.items() if rate is not None)
    figures = "/".join(f"{rate:.0f}" for rate in rates.values() if rate is not None)
    each = ", ".join(f"{name} {value:.2f}" for name, value in ratios.items() if value is not None)
    cpu = f", CPU base/flowbeat {r.cpu_over_base:.2f}" if r.cpu_over_base is not None else ""
    return f"{shown} {figures}" + (f": {each}{cpu}" if each else "")


def _cpu_line(name: str, parts: dict[str, float]) -> str:
    each = ", ".join(f"{part} {ms:.2f}" for part, ms in parts.items())
    return f"    {name}: {sum(parts.values()):.2f} ms ({each})"
