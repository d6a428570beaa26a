"""The medians of ``bench.peers``'s rounds, its targets, and its table."""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict
from typing import Any

from bench.harness import WORKER_CONCURRENCY
from bench.peers.measure import SideResult
from bench.rounds import CALIBRATION_LOOP, interpreter, machine_pace, pace_line

PARTS = ("broker", "db", "worker", "api", "client")
NOT_SIDES = ("targets", "pace", "floor_over")
"""The summary's entries that are not a side's."""
TARGETS = (
    ("chains", "raw celery", 1.5),
    ("fanout", "raw celery", 0.8),
    ("chains", "procrastinate", 3.0),
    ("chains", "prefect", 3.0),
    ("fanout", "procrastinate", 3.0),
    ("fanout", "prefect", 3.0),
    ("chains", "dramatiq", 0.7),
    ("fanout", "dramatiq", 0.7),
)
"""(figure, peer, the least flowbeat's rate over the peer's may be)."""


def _rate(side: SideResult | None, figure: str) -> float | None:
    if side is None:
        return None
    if figure == "chains":
        return side.chains.steps_per_s if side.chains else None
    return side.fanout.items_per_s if side.fanout else None


def _median(values: list[float]) -> float | None:
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2] if ordered else None


def summary(rounds: list[dict[str, Any]], sides: list[str]) -> dict[str, Any]:
    """Per side: the figures of its median round by chain steps/s, and the median over rounds
    of flowbeat's rate over the side's in the same round (the lower middle for an even
    count), all of the undisturbed rounds, or of every round when all were disturbed."""
    clean = [r for r in rounds if not r["disturbed"]] or rounds
    out: dict[str, Any] = {}
    for name in sides:
        runs = [r["sides"][name] for r in clean if name in r["sides"]]
        ranked = sorted(runs, key=lambda s: _rate(s, "chains") or 0.0)
        middle = ranked[(len(ranked) - 1) // 2] if ranked else None
        ratios = {}
        for figure in ("chains", "fanout"):
            pairs = [
                (_rate(r["sides"].get("flowbeat"), figure), _rate(r["sides"][name], figure))
                for r in clean
                if name in r["sides"]
            ]
            ratios[figure] = _median([fb / peer for fb, peer in pairs if fb and peer])
        out[name] = {
            "median_round": asdict(middle) if middle else None,
            "flowbeat_over_side": ratios,
            "chain_steps_per_s": [_rate(s, "chains") for s in runs],
            "fanout_items_per_s": [_rate(s, "fanout") for s in runs],
        }
    targets = []
    for figure, peer, target in TARGETS:
        if peer in out and "flowbeat" in out:
            ratio = out[peer]["flowbeat_over_side"][figure]
            met = ratio is not None and ratio >= target
            targets.append(
                {"figure": figure, "peer": peer, "target": target, "ratio": ratio, "met": met}
            )
    out["targets"] = targets
    if "floor" in out:
        peers = [name for name in sides if name not in ("flowbeat", "floor")]
        out["floor_over"] = {name: _floor_over(clean, name) for name in peers}
    loops = [ms for r in rounds for ms in (r["before"]["loop_ms"], r["after"]["loop_ms"])]
    out["pace"] = machine_pace(loops)
    return out


def _floor_over(clean: list[dict[str, Any]], peer: str) -> float | None:
    """The median over rounds of the floor side's chain rate over ``peer``'s."""
    pairs = [
        (_rate(r["sides"].get("floor"), "chains"), _rate(r["sides"].get(peer), "chains"))
        for r in clean
    ]
    return _median([floor / other for floor, other in pairs if floor and other])


def _f(value: float | None, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def _row(name: str, figures: dict[str, Any]) -> str:
    side = figures["median_round"] or {}
    chains, fanout = side.get("chains") or {}, side.get("fanout") or {}
    cpu = chains.get("cpu_ms_per_job", {})
    parts = "/".join(_f(cpu.get(part), ".1f") for part in PARTS)
    total = _f(sum(cpu.values()) if cpu else None, ".1f")
    ratio = figures["flowbeat_over_side"]
    return (
        f"  {name:<14}{_f(chains.get('steps_per_s')):>8}{_f(ratio['chains'], '.2f'):>8}"
        f"{_f(chains.get('p50_ms')):>9}{_f(chains.get('p99_ms')):>9}"
        f"{total:>12} ({parts}){_f(chains.get('peak_mib')):>8}"
        f"{_f(fanout.get('items_per_s')):>9}{_f(ratio['fanout'], '.2f'):>8}"
    )


def print_report(
    args: argparse.Namespace, rounds: list[dict[str, Any]], figures: dict[str, Any]
) -> None:
    print()
    print(
        f"peers: {args.chains} chains of 3 no-op steps and a fan-out of {args.fanout} items "
        f"with a gather per side, {WORKER_CONCURRENCY} steps at once, {os.cpu_count()} cpus, "
        f"{interpreter()}"
    )
    print(
        f"  {'side':<14}{'steps/s':>8}{'fb/x':>8}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'CPU ms/job':>12} ({'/'.join(PARTS)}){'MiB':>8}{'items/s':>9}{'fb/x':>8}"
    )
    for name, side in figures.items():
        if name not in NOT_SIDES:
            print(_row(name, side))
    print("  fb/x: flowbeat's rate over the side's, the median of the rounds' ratios")
    for target in figures["targets"]:
        verdict = "met" if target["met"] else "MISSED"
        print(
            f"  target flowbeat/{target['peer']} {target['figure']}: "
            f"{_f(target['ratio'], '.2f')} (>= {target['target']}): {verdict}"
        )
    if figures.get("floor_over"):
        each = ", ".join(f"{name} {_f(r, '.2f')}" for name, r in figures["floor_over"].items())
        print(
            f"  the floor's chain rate over each side's: {each}: the most a design that takes "
            "each job over HTTP, runs it from one Celery message and commits each step's "
            "checkpoint could reach against that side here"
        )
    print(f"  {len(rounds)} rounds (each side's steps/s | items/s; calibration before/after):")
    for r in rounds:
        each = ", ".join(
            f"{name} {_f(_rate(side, 'chains'))}|{_f(_rate(side, 'fanout'))}"
            for name, side in r["sides"].items()
        )
        b, a = r["before"], r["after"]
        print(
            f"    {each} (loop {b['loop_ms']:.0f}/{a['loop_ms']:.0f} ms of "
            f"{CALIBRATION_LOOP:,} steps, background {b['background_cores']:.2f}/"
            f"{a['background_cores']:.2f} cores, load {b['load_1m']:.2f}/{a['load_1m']:.2f})"
            + (" DISTURBED" if r["disturbed"] else "")
        )
    for name, side in figures.items():
        if name in NOT_SIDES or not side["median_round"]:
            continue
        notes = [side["median_round"]["note"], (side["median_round"]["fanout"] or {}).get("note")]
        for note in filter(None, notes):
            print(f"  note, {name}: {note}")
    print(pace_line(figures["pace"]))
