"""Data refresh actions: ``data.download``, ``data.parse``, ``data.upsert``, ``data.dedupe``.

``data.download`` writes under ``downloads/`` in the data store and ``data.parse`` reads only
from it (``service.platform.datastore``): ``data_dir`` by default, or, with workers on several
hosts, a shared volume or an S3 bucket that each of them reaches. ``data.upsert`` writes only
into tables that already exist in the ``upsert_schema`` setting: a profile, which may come from
any user with write scope, can fill tables an operator created but can neither create, alter
nor reach tables elsewhere.
"""

import csv
import hashlib
import io
import json
import re
from dataclasses import replace
from pathlib import PurePosixPath
from typing import Any

import httpx
import psycopg
from psycopg import sql

from service.actions.context import StepContext
from service.actions.data import get_path
from service.actions.registry import action
from service.platform.datastore import data_store
from service.platform.db import connect_kwargs, libpq_url
from service.platform.egress import EgressPolicy, guarded_client
from service.platform.errors import ActionError
from service.platform.storage import Staged

TABLE_PATTERN = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
SHA256_PATTERN = re.compile(r"^[0-9a-f]{64}$")
DOWNLOADS = "downloads"
SUFFIXES = frozenset({".csv", ".jsonl", ".ndjson", ".json", ".txt"})
PARSE_FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
UPSERT_BATCH = 500
CHUNK = 64 * 1024


def _bad(action_name: str, message: str, reason: str = "bad_inputs", **details: Any) -> ActionError:
    return ActionError(f"{action_name}: {message}", {"reason": reason, **details}, retryable=False)


def _download_to(
    ctx: StepContext, policy: EgressPolicy, url: str, cap: int, handle: Staged
) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with guarded_client(policy) as client, client.stream("GET", url) as response:
        status = response.status_code
        if status >= 400:
            raise ActionError(
                f"data.download: GET {url} returned HTTP {status}",
                {"reason": "http_status", "status": status},
                retryable=status >= 500 or status == 429,
            )
        declared = response.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > cap:
            raise _bad("data.download", f"{url} declares {declared} bytes", "too_large", cap=cap)
        for chunk in response.iter_bytes(CHUNK):
            ctx.check_cancelled()
            size += len(chunk)
            if size > cap:
                raise _bad("data.download", f"{url} is over {cap} bytes", "too_large", cap=cap)
            digest.update(chunk)
            handle.write(chunk)
    return digest.hexdigest(), size


@action("data.download", cache=False)
def download(
    ctx: StepContext, url: str, sha256: str | None = None, max_bytes: int | None = None
) -> dict[str, Any]:
    """Stream ``url`` into ``downloads/<sha256><suffix>`` in the data store.

    The file is named by its content, so a retried or repeated download of the same data lands
    on the same file. A checksum mismatch is not retried: the same URL will serve the same bytes.
    ``path`` in the result is relative to the store, so ``data.parse`` finds it on any worker
    that shares the store.
    """
    ctx.check_cancelled()
    try:
        parsed = httpx.URL(url) if isinstance(url, str) else None
    except httpx.InvalidURL:
        parsed = None
    if parsed is None:
        raise _bad("data.download", f"not a URL: {url!r}")
    policy = replace(
        EgressPolicy.from_settings(ctx.settings, "data.download"),
        max_bytes=ctx.settings.download_max_bytes,
    )
    policy.check_url(parsed)
    if not parsed.host:
        raise _bad("data.download", f"no host in {url!r}")
    if isinstance(sha256, str):
        sha256 = sha256.strip().lower()
    if sha256 is not None and (not isinstance(sha256, str) or not SHA256_PATTERN.match(sha256)):
        raise _bad("data.download", "sha256 must be 64 hex digits")
    cap = policy.max_bytes
    if max_bytes is not None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise _bad("data.download", "max_bytes must be a positive integer")
        cap = min(cap, max_bytes)
    suffix = PurePosixPath(parsed.path).suffix.lower()
    try:
        with data_store(ctx.settings).staging(DOWNLOADS) as staged:
            digest, size = _download_to(ctx, policy, url, cap, staged)
            if sha256 is not None and digest != sha256:
                raise _bad(
                    "data.download",
                    f"checksum mismatch for {url}: expected {sha256}, got {digest}",
                    "checksum_mismatch",
                    expected=sha256,
                    actual=digest,
                )
            name = digest + (suffix if suffix in SUFFIXES else "")
            staged.commit(name)
    except httpx.TimeoutException as exc:
        raise ActionError(f"data.download: GET {url} timed out", {"reason": "timeout"}) from exc
    except httpx.TransportError as exc:
        raise ActionError(
            f"data.download: GET {url} failed: {type(exc).__name__}: {exc}",
            {"reason": "transport"},
        ) from exc
    return {"path": f"{DOWNLOADS}/{name}", "sha256": digest, "bytes": size}


def _rows(text: io.TextIOBase, fmt: str, cap: int, empty_as_null: bool) -> list[Any]:
    rows: list[Any] = []
    if fmt == "csv":
        for row in csv.DictReader(text):
            rows.append({k: (None if empty_as_null and v == "" else v) for k, v in row.items()})
            if len(rows) > cap:
                break
        return rows
    for number, line in enumerate(text, start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError as exc:
            raise _bad(
                "data.parse", f"line {number} is not JSON: {exc}", "bad_data", line=number
            ) from exc
        if len(rows) > cap:
            break
    return rows


@action("data.parse", cache=False)
def parse(
    ctx: StepContext,
    path: str,
    format: str | None = None,
    max_rows: int | None = None,
    empty_as_null: bool = True,
) -> list[Any]:
    """Rows of a CSV (objects keyed by the header) or JSON-lines file in the data store.

    CSV cells are strings; PostgreSQL casts them to the column types on upsert, and with
    ``empty_as_null`` an empty cell becomes null so an empty number is not a cast error.
    More rows than the cap fail the step rather than silently loading part of a file.
    """
    fmt = format.lower() if isinstance(format, str) else None
    if fmt is None and isinstance(path, str):
        fmt = PARSE_FORMATS.get(PurePosixPath(path).suffix.lower())
    if fmt not in {"csv", "jsonl"}:
        raise _bad("data.parse", "cannot tell the format; pass format csv or jsonl")
    cap = ctx.settings.parse_max_rows
    if max_rows is not None:
        if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
            raise _bad("data.parse", "max_rows must be a positive integer")
        cap = min(cap, max_rows)
    try:
        with (
            data_store(ctx.settings).reader(path, "data.parse") as raw,
            io.TextIOWrapper(raw, encoding="utf-8-sig", newline="") as text,
        ):
            rows = _rows(text, fmt, cap, empty_as_null)
    except (UnicodeDecodeError, csv.Error) as exc:
        raise _bad("data.parse", f"cannot parse {path!r}: {exc}", "bad_data") from exc
    if len(rows) > cap:
        raise _bad("data.parse", f"{path!r} has more than {cap} rows", "too_many_rows", cap=cap)
    return rows


@action("data.dedupe")
def dedupe(ctx: StepContext, items: Any, key: str) -> list[Any]:
    """The first item for each value of ``key`` (a dotted path); items without it are dropped.

    Merging searches of several sources puts the preferred source first, so its record wins.
    """
    if not isinstance(items, list):
        raise _bad("data.dedupe", "items must be a list")
    if not isinstance(key, str) or not key:
        raise _bad("data.dedupe", "key must be a non-empty string")
    seen: set[str] = set()
    out: list[Any] = []
    for item in items:
        value = get_path(item, key)
        if value is None or isinstance(value, dict | list) or not isinstance(value, str | int):
            continue
        marker = json.dumps(value)
        if marker not in seen:
            seen.add(marker)
            out.append(item)
    return out


def _identifiers(value: Any, what: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise _bad("data.upsert", f"{what} must be a non-empty list of column names")
    return list(dict.fromkeys(value))


def _table_columns(conn: psycopg.Connection[Any], schema: str, table: str) -> set[str]:
    found = conn.execute(
        "SELECT column_name FROM information_schema.columns "
        "WHERE table_schema = %s AND table_name = %s",
        (schema, table),
    ).fetchall()
    return {str(row[0]) for row in found}


def _statement(schema: str, table: str, columns: list[str], keys: list[str]) -> sql.Composed:
    updated = [c for c in columns if c not in keys] or keys
    target = sql.SQL("({})").format(sql.SQL(", ").join(sql.Identifier("t", c) for c in updated))
    excluded = sql.SQL("({})").format(
        sql.SQL(", ").join(sql.Identifier("excluded", c) for c in updated)
    )
    return sql.SQL(
        "INSERT INTO {table} AS t ({columns}) VALUES ({values}) "
        "ON CONFLICT ({keys}) DO UPDATE SET {sets} "
        "WHERE ROW{target} IS DISTINCT FROM ROW{excluded} "
        "RETURNING (xmax = 0) AS inserted"
    ).format(
        table=sql.Identifier(schema, table),
        columns=sql.SQL(", ").join(map(sql.Identifier, columns)),
        values=sql.SQL(", ").join(sql.Placeholder() * len(columns)),
        keys=sql.SQL(", ").join(map(sql.Identifier, keys)),
        sets=sql.SQL(", ").join(
            sql.SQL("{} = {}").format(sql.Identifier(c), sql.Identifier("excluded", c))
            for c in updated
        ),
        target=target,
        excluded=excluded,
    )


@action("data.upsert", cache=False)
def upsert(
    ctx: StepContext, table: str, rows: Any, keys: Any, columns: Any = None
) -> dict[str, int]:
    """Insert or update ``rows`` by ``keys`` in ``<upsert_schema>.<table>``, in one transaction.

    The table must exist and have a unique constraint on ``keys``. Rows with the same key keep
    the last one. A row that matches the stored one is counted unchanged and not rewritten, so
    a refresh of unchanged data does not bloat the table.
    """
    if not isinstance(table, str) or not TABLE_PATTERN.match(table):
        raise _bad("data.upsert", f"table must match {TABLE_PATTERN.pattern}, got {table!r}")
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise _bad("data.upsert", "rows must be a list of objects")
    key_columns = _identifiers(keys, "keys")
    wanted = (
        _identifiers(columns, "columns")
        if columns is not None
        else list(dict.fromkeys(c for row in rows for c in row))
    )
    names = list(dict.fromkeys([*key_columns, *wanted]))
    by_key: dict[str, list[Any]] = {}
    for index, row in enumerate(rows):
        if any(row.get(k) is None for k in key_columns):
            raise _bad("data.upsert", f"row {index} has no value for a key column", index=index)
        values = [row.get(c) for c in names]
        values = [json.dumps(v) if isinstance(v, dict | list) else v for v in values]
        by_key[json.dumps([row[k] for k in key_columns], default=str)] = values
    schema = ctx.settings.upsert_schema
    ctx.check_cancelled()
    try:
        url = ctx.settings.require_database_url()
        with psycopg.connect(
            libpq_url(url), **connect_kwargs(url, ctx.settings.database_pooled)
        ) as conn:
            existing = _table_columns(conn, schema, table)
            if not existing:
                raise _bad("data.upsert", f"no table {schema}.{table}", "unknown_table")
            unknown = sorted(set(names) - existing)
            if unknown:
                raise _bad(
                    "data.upsert", f"{schema}.{table} has no columns {unknown}", "unknown_columns"
                )
            statement = _statement(schema, table, names, key_columns)
            batch = list(by_key.values())
            inserted = updated = 0
            with conn.cursor() as cursor:
                for start in range(0, len(batch), UPSERT_BATCH):
                    ctx.check_cancelled()
                    cursor.executemany(
                        statement, batch[start : start + UPSERT_BATCH], returning=True
                    )
                    while True:
                        for (was_inserted,) in cursor.fetchall():
                            inserted += bool(was_inserted)
                            updated += not was_inserted
                        if not cursor.nextset():
                            break
    except psycopg.errors.InvalidColumnReference as exc:
        raise _bad(
            "data.upsert", f"no unique constraint on {key_columns}: {exc}", "no_unique_key"
        ) from exc
    except (psycopg.DataError, psycopg.IntegrityError, psycopg.ProgrammingError) as exc:
        raise _bad("data.upsert", f"rows refused: {exc}", "bad_rows") from exc
    except psycopg.OperationalError as exc:
        raise ActionError(f"data.upsert: database unavailable: {exc}", {"reason": "db"}) from exc
    return {"inserted": inserted, "updated": updated, "unchanged": len(by_key) - inserted - updated}
