"""Data shaping over JSON lists, and loading data files shipped under the profiles directory."""

import csv
import io
import json
import math
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from service.actions.context import StepContext
from service.actions.registry import action
from service.language.loading import search_dirs
from service.platform.datastore import resolve_under
from service.platform.errors import ActionError

MAX_LOAD_BYTES = 50 * 1024 * 1024
FORMATS = {".json": "json", ".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv"}

_MISSING: Any = object()


def _bad(message: str, reason: str = "bad_inputs", **details: Any) -> ActionError:
    return ActionError(message, {"reason": reason, **details}, retryable=False)


def _as_list(items: Any, name: str) -> list[Any]:
    if not isinstance(items, list):
        raise _bad(f"{name}: items must be a list, got {type(items).__name__}")
    return items


def _fields(fields: Any, name: str) -> list[str]:
    if isinstance(fields, str):
        fields = [fields]
    if not isinstance(fields, list) or not all(isinstance(f, str) and f for f in fields):
        raise _bad(f"{name}: fields must be a list of non-empty strings")
    return fields


def get_path(item: Any, path: str) -> Any:
    """Follow a dotted path through objects (and list indices); ``_MISSING`` when it breaks."""
    current = item
    for part in path.split("."):
        if isinstance(current, dict):
            if part not in current:
                return _MISSING
            current = current[part]
        elif isinstance(current, list) and part.lstrip("-").isdigit():
            index = int(part)
            if not -len(current) <= index < len(current):
                return _MISSING
            current = current[index]
        else:
            return _MISSING
    return current


@action("data.select")
def select(ctx: StepContext, items: Any, fields: Any) -> list[dict[str, Any]]:
    """Keep only ``fields``; a dotted path becomes a flat key; absent fields are left out."""
    paths = _fields(fields, "data.select")
    out: list[dict[str, Any]] = []
    for index, item in enumerate(_as_list(items, "data.select")):
        if not isinstance(item, dict):
            raise _bad(f"data.select: item {index} is not an object", index=index)
        picked = {path: get_path(item, path) for path in paths}
        out.append({key: value for key, value in picked.items() if value is not _MISSING})
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _ordered(left: Any, right: Any, compare: Callable[[Any, Any], bool]) -> bool:
    if _is_number(left) and _is_number(right):
        return compare(left, right)
    if isinstance(left, str) and isinstance(right, str):
        return compare(left, right)
    return False


def _contains(found: Any, value: Any) -> bool:
    if isinstance(found, str):
        return isinstance(value, str) and value in found
    if isinstance(found, list):
        return value in found
    if isinstance(found, dict):
        return isinstance(value, str) and value in found
    return False


def _exists(found: Any, value: Any) -> bool:
    present = found is not _MISSING and found is not None
    return present if value is None else present == bool(value)


_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "eq": lambda found, value: found is not _MISSING and found == value,
    "ne": lambda found, value: found is _MISSING or found != value,
    "gt": lambda found, value: _ordered(found, value, lambda a, b: a > b),
    "gte": lambda found, value: _ordered(found, value, lambda a, b: a >= b),
    "lt": lambda found, value: _ordered(found, value, lambda a, b: a < b),
    "lte": lambda found, value: _ordered(found, value, lambda a, b: a <= b),
    "in": lambda found, value: found is not _MISSING and found in value,
    "contains": _contains,
    "exists": _exists,
}
OPS = frozenset(_OPS)


@action("data.filter")
def filter_items(ctx: StepContext, items: Any, field: str, op: str, value: Any = None) -> list[Any]:
    """Keep items whose ``field`` satisfies ``op``.

    Comparisons between different types (a string against a number) never match rather than
    fail, so one odd record cannot sink a whole run. ``exists`` means present and not null;
    with ``value: false`` it keeps the items where it is absent.
    """
    rows = _as_list(items, "data.filter")
    if not isinstance(field, str) or not field:
        raise _bad("data.filter: field must be a non-empty string")
    test = _OPS.get(op) if isinstance(op, str) else None
    if test is None:
        raise _bad(f"data.filter: unknown op {op!r}; use one of {', '.join(sorted(OPS))}", op=op)
    if op == "in" and not isinstance(value, list):
        raise _bad("data.filter: op 'in' needs a list value")
    if op in {"gt", "gte", "lt", "lte"} and not (_is_number(value) or isinstance(value, str)):
        raise _bad(f"data.filter: op {op!r} needs a number or string value")
    return [item for item in rows if test(get_path(item, field), value)]


@action("data.flatten")
def flatten(ctx: StepContext, items: Any) -> list[Any]:
    """One level: lists are spliced in, anything else is kept as a single element."""
    out: list[Any] = []
    for element in _as_list(items, "data.flatten"):
        if isinstance(element, list):
            out.extend(element)
        else:
            out.append(element)
    return out


def _sort_key(value: Any) -> tuple[int, Any]:
    if _is_number(value):
        return (0, value)
    if isinstance(value, bool):
        return (1, value)
    if isinstance(value, str):
        return (2, value)
    return (3, json.dumps(value, sort_keys=True, default=str))


@action("data.sort")
def sort(ctx: StepContext, items: Any, field: str, descending: bool = False) -> list[Any]:
    """Stable sort by ``field``; items without it (or with null) go last in either direction.

    Mixed types sort in groups (numbers, booleans, strings, others) instead of raising.
    """
    rows = _as_list(items, "data.sort")
    if not isinstance(field, str) or not field:
        raise _bad("data.sort: field must be a non-empty string")
    keyed = [(get_path(item, field), item) for item in rows]
    present = [(v, item) for v, item in keyed if v is not _MISSING and v is not None]
    absent = [item for v, item in keyed if v is _MISSING or v is None]
    for value, _ in present:
        if isinstance(value, float) and math.isnan(value):
            raise _bad("data.sort: cannot sort NaN values")
    present.sort(key=lambda pair: _sort_key(pair[0]), reverse=bool(descending))
    return [item for _, item in present] + absent


@action("data.count")
def count(ctx: StepContext, items: Any) -> dict[str, int]:
    """How many items a list holds, as ``{count}``."""
    return {"count": len(_as_list(items, "data.count"))}


def resolve_data_path(base_dir: Path, path: str) -> Path:
    """``path`` under ``base_dir``, a profiles directory; anything that would leave it is
    refused (``resolve_under``), since a profile may come from any user."""
    try:
        return resolve_under(base_dir, path, "data.load", "profiles directory")
    except FileNotFoundError:
        raise _bad(f"data.load: no such file: {path!r}", "not_found", path=path) from None


def _profile_data(profiles_dir: Path | None, path: str) -> Path:
    """``path`` in the operator's profile directory, else among the shipped profiles' data."""
    *first, last = search_dirs(profiles_dir)
    for directory in first:
        try:
            return resolve_data_path(directory, path)
        except ActionError as exc:
            if exc.details.get("reason") != "not_found":
                raise
    return resolve_data_path(last, path)


def _parse(raw: bytes, fmt: str, path: str) -> list[Any]:
    text = raw.decode("utf-8-sig")
    if fmt == "json":
        loaded = json.loads(text)
        if not isinstance(loaded, list):
            raise _bad(f"data.load: {path!r} must hold a JSON list", "bad_data", path=path)
        return loaded
    if fmt == "jsonl":
        rows: list[Any] = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except ValueError as exc:
                raise _bad(
                    f"data.load: {path!r} line {number} is not JSON: {exc}",
                    "bad_data",
                    path=path,
                    line=number,
                ) from exc
        return rows
    return [dict(row) for row in csv.DictReader(io.StringIO(text, newline=""))]


@action("data.load", cache=False)
def load(ctx: StepContext, path: str, format: str | None = None) -> list[Any]:
    """Read a JSON list, JSON lines or CSV (rows as string-valued objects) from the profiles dir."""
    fmt = format.lower() if isinstance(format, str) else None
    if fmt is None:
        fmt = FORMATS.get(PurePosixPath(path).suffix.lower()) if isinstance(path, str) else None
        if fmt is None:
            raise _bad(
                f"data.load: cannot tell the format of {path!r}; pass format json, jsonl or csv"
            )
    elif fmt not in FORMATS.values():
        raise _bad(f"data.load: unknown format {format!r}; use json, jsonl or csv")
    target = _profile_data(ctx.settings.profiles_dir, path)
    if target.stat().st_size > MAX_LOAD_BYTES:
        raise _bad(f"data.load: {path!r} is over {MAX_LOAD_BYTES} bytes", "too_large", path=path)
    with target.open("rb") as handle:
        raw = handle.read(MAX_LOAD_BYTES + 1)
    if len(raw) > MAX_LOAD_BYTES:
        raise _bad(f"data.load: {path!r} is over {MAX_LOAD_BYTES} bytes", "too_large", path=path)
    try:
        return _parse(raw, fmt, path)
    except (UnicodeDecodeError, ValueError, csv.Error) as exc:
        if isinstance(exc, ActionError):
            raise
        raise _bad(f"data.load: cannot parse {path!r}: {exc}", "bad_data", path=path) from exc
