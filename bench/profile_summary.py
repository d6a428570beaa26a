"""Where the CPU goes in py-spy's raw (collapsed) profiles, by process and by library.

    python -m bench.profile_summary DIR [--per N] [--top 12]

Reads every ``*.txt`` that ``--py-spy DIR`` of a bench wrote. A sample is one CPU stack of
one thread; py-spy leaves out idle threads, so samples / rate is CPU time. Each profile is
split into the main process and its children (a prefork worker's pool), and each sample is
charged to the library of its innermost frame (self time) and, once per library, to every
library on its stack (inclusive time). ``--per N`` divides by N units of work (jobs or
chains) to print milliseconds per unit at py-spy's rate of 200 samples a second.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

SAMPLES_PER_S = 200
PROCESS = re.compile(r"^process \d+:")
FRAME_FILE = re.compile(r"\(([^():]+):\d+\)$")
OWN_PACKAGES = ("service", "tasks", "api", "scheduler", "bench")


@dataclass
class Profile:
    name: str
    samples: Counter[str] = field(default_factory=Counter)
    self_by_library: Counter[str] = field(default_factory=Counter)
    inclusive_by_library: Counter[str] = field(default_factory=Counter)
    inclusive_by_function: Counter[str] = field(default_factory=Counter)


def library(frame: str) -> str:
    """The package a frame's file belongs to: ``celery``, ``psycopg``, ``service``, ..."""
    found = FRAME_FILE.search(frame)
    if not found:
        return "other"
    path = found.group(1)
    if path.startswith("<frozen"):
        return "stdlib"
    head = path.split("/")[0]
    return head.removesuffix(".py") if "/" in path else "stdlib"


def stacks(path: Path) -> Iterator[tuple[list[str], int, str]]:
    """Each stack of a raw profile, outermost frame first, with its sample count and whether it
    ran in the main process or in one of its children."""
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        frames = stack.split(";")
        processes = [f for f in frames if PROCESS.match(f)]
        role = "main" if len(processes) <= 1 else "children"
        frames = [f for f in frames if not PROCESS.match(f)]
        if frames:
            yield frames, int(count_text), role


def parse(path: Path) -> Profile:
    profile = Profile(path.stem)
    for frames, count, role in stacks(path):
        profile.samples[role] += count
        profile.self_by_library[library(frames[-1])] += count
        for lib in {library(f) for f in frames}:
            profile.inclusive_by_library[lib] += count
        for frame in {f for f in frames if library(f) in OWN_PACKAGES}:
            profile.inclusive_by_function[frame] += count
    return profile


PARTS = {
    "psycopg": ("psycopg", "psycopg_binary", "psycopg_pool"),
    "sqlalchemy": ("sqlalchemy",),
    "redis": ("redis",),
    "kombu": ("kombu",),
    "billiard": ("billiard",),
    "celery": ("celery",),
    "flowbeat": OWN_PACKAGES,
}
STDLIB = "json/other stdlib"
OTHER = "other"


@dataclass
class Parts:
    """A worker's samples by part, two ways. ``by_library``: each sample goes to the innermost
    frame from a library of ``PARTS``, so the standard library's work (json, sockets,
    selectors, threading) and that of unlisted helpers (vine, amqp, click) are charged to the
    library that called them; ``STDLIB`` keeps only stacks with nothing else on them. This
    answers where the worker's time goes by library: a socket write is redis's cost, and kombu's
    JSON is kombu's. ``leaf``: each sample goes to its innermost frame's own part, the self
    time, which shows how much of it the standard library does itself."""

    samples: int
    pool: int
    """Samples in the pool's processes, the others being the worker's main process."""
    by_library: dict[str, int] = field(default_factory=dict)
    leaf: dict[str, int] = field(default_factory=dict)


def part(frame: str) -> str:
    lib = library(frame)
    for name, packages in PARTS.items():
        if lib in packages:
            return name
    return STDLIB if lib == "stdlib" or lib in sys.stdlib_module_names else OTHER


def parts(path: Path) -> Parts:
    """``Parts`` of the raw profile at ``path``."""
    by_library: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    roles: Counter[str] = Counter()
    for frames, count, role in stacks(path):
        own = [part(frame) for frame in frames]
        listed = [p for p in own if p in PARTS]
        unlisted = STDLIB if all(p == STDLIB for p in own) else OTHER
        by_library[listed[-1] if listed else unlisted] += count
        leaf[own[-1]] += count
        roles[role] += count
    return Parts(sum(roles.values()), roles["children"], dict(by_library), dict(leaf))


def parts_table(found: Parts) -> list[str]:
    total = max(found.samples, 1)
    lines = [
        f"  {found.samples:,} samples at {SAMPLES_PER_S} a second, "
        f"{found.pool / total:.0%} of them in the pool's processes",
        f"    {'part':<20} {'by library':>17} {'leaf':>7}",
    ]
    for name in (*PARTS, STDLIB, OTHER):
        n, own = found.by_library.get(name, 0), found.leaf.get(name, 0)
        lines.append(f"    {name:<20} {n / total:7.1%} ({n:>6,}) {own / total:7.1%}")
    return lines


def ms(samples: int, per: int) -> str:
    return f"{samples / SAMPLES_PER_S * 1000 / per:.2f} ms" if per else f"{samples} samples"


def show(profile: Profile, per: int, top: int) -> None:
    total = sum(profile.samples.values())
    roles = ", ".join(f"{role} {ms(n, per)}" for role, n in sorted(profile.samples.items()))
    print(f"{profile.name}: {ms(total, per)} of CPU ({roles})")
    print("  self time by library (innermost frame):")
    for lib, n in profile.self_by_library.most_common(top):
        print(f"    {lib:<22} {ms(n, per):>10}  {n / total:6.1%}")
    print("  inclusive time by library (on the stack):")
    for lib, n in profile.inclusive_by_library.most_common(top):
        print(f"    {lib:<22} {ms(n, per):>10}  {n / total:6.1%}")
    if profile.inclusive_by_function:
        print("  flowbeat's own functions, inclusive:")
        for frame, n in profile.inclusive_by_function.most_common(top):
            print(f"    {frame[:70]:<70} {ms(n, per):>10}  {n / total:6.1%}")
    print()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_summary", description=__doc__)
    parser.add_argument("dir", type=Path)
    parser.add_argument("--per", type=int, default=0, help="units of work to divide by")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args(argv)
    files = sorted(args.dir.glob("*.txt"))
    if not files:
        print(f"no py-spy profiles in {args.dir}", file=sys.stderr)
        return 2
    for path in files:
        show(parse(path), args.per, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
