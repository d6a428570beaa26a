"""Data refresh actions: download from a local server, parse, upsert into the real database."""

import hashlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from service.actions import REGISTRY, StepContext, load_plugins
from service.platform.errors import ActionError
from tests.conftest import Stack
from tests.service.actions import make_ctx
from tests.support.files import CSV, file_server


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with file_server() as url:
        yield url


@pytest.fixture(scope="module", autouse=True)
def _builtins() -> None:
    load_plugins(REGISTRY, [], entry_points=[])


@pytest.fixture
def ctx(tmp_path: Path) -> StepContext:
    return make_ctx(data_dir=tmp_path, download_max_bytes=4096)


def call(ctx: StepContext, name: str, **inputs: Any) -> Any:
    return REGISTRY.call(name, ctx, inputs)


def refused(ctx: StepContext, name: str, **inputs: Any) -> ActionError:
    with pytest.raises(ActionError) as info:
        call(ctx, name, **inputs)
    return info.value


def test_download_with_the_right_checksum_is_stored_by_content(
    server: str, ctx: StepContext, tmp_path: Path
) -> None:
    digest = hashlib.sha256(CSV).hexdigest()
    out = call(ctx, "data.download", url=f"{server}/countries.csv", sha256=digest.upper())
    assert out == {"path": f"downloads/{digest}.csv", "sha256": digest, "bytes": len(CSV)}
    assert (tmp_path / out["path"]).read_bytes() == CSV
    assert [p.name for p in (tmp_path / "downloads").iterdir()] == [f"{digest}.csv"]


def test_a_checksum_mismatch_is_refused_and_leaves_no_file(
    server: str, ctx: StepContext, tmp_path: Path
) -> None:
    error = refused(ctx, "data.download", url=f"{server}/countries.csv", sha256="0" * 64)
    assert error.details["reason"] == "checksum_mismatch"
    assert error.retryable is False
    assert list((tmp_path / "downloads").iterdir()) == []


@pytest.mark.parametrize("path", ["/big.csv", "/big-unsized.csv"])
def test_a_download_over_the_size_cap_is_refused(
    server: str, ctx: StepContext, tmp_path: Path, path: str
) -> None:
    error = refused(ctx, "data.download", url=f"{server}{path}")
    assert error.details["reason"] == "too_large"
    assert list((tmp_path / "downloads").iterdir()) == []


def test_a_server_error_is_retryable_and_a_missing_file_is_not(
    server: str, ctx: StepContext
) -> None:
    assert refused(ctx, "data.download", url=f"{server}/down").retryable is True
    assert refused(ctx, "data.download", url=f"{server}/nope").retryable is False


@pytest.mark.parametrize(
    "inputs",
    [{"url": "file:///etc/passwd"}, {"url": "ftp://example.org/x"}, {"url": "x", "sha256": "ab"}],
)
def test_bad_download_inputs_are_refused(ctx: StepContext, inputs: dict[str, Any]) -> None:
    assert refused(ctx, "data.download", **inputs).retryable is False


def test_parse_csv_after_download(server: str, ctx: StepContext) -> None:
    path = call(ctx, "data.download", url=f"{server}/countries.csv")["path"]
    rows = call(ctx, "data.parse", path=path)
    assert rows == [
        {"code": "GB", "name": "United Kingdom", "population": "68350000"},
        {"code": "FR", "name": "France", "population": "68170000"},
        {"code": "IS", "name": "Iceland", "population": None},
    ]


def test_parse_json_lines_skips_blank_lines(server: str, ctx: StepContext) -> None:
    path = call(ctx, "data.download", url=f"{server}/countries.jsonl")["path"]
    assert [row["code"] for row in call(ctx, "data.parse", path=path)] == ["GB", "NO"]


def test_parse_refuses_more_rows_than_the_cap(server: str, ctx: StepContext) -> None:
    path = call(ctx, "data.download", url=f"{server}/countries.csv")["path"]
    assert refused(ctx, "data.parse", path=path, max_rows=2).details["reason"] == "too_many_rows"


@pytest.mark.parametrize("path", ["../secret.csv", "/etc/passwd.csv", "downloads/none.csv"])
def test_parse_reads_only_files_under_the_data_dir(ctx: StepContext, path: str) -> None:
    assert refused(ctx, "data.parse", path=path).retryable is False


def test_parse_refuses_a_symlink_out_of_the_data_dir(ctx: StepContext, tmp_path: Path) -> None:
    outside = tmp_path.parent / f"outside-{uuid.uuid4().hex}.csv"
    outside.write_text("a\n1\n")
    (tmp_path / "link.csv").symlink_to(outside)
    assert refused(ctx, "data.parse", path="link.csv").details["reason"] == "bad_path"


@pytest.fixture
def table(stack: Stack) -> Iterator[str]:
    name = f"countries_{uuid.uuid4().hex[:8]}"
    url = stack.database_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url) as conn:
        conn.execute(
            f"CREATE TABLE datasets.{name} (code text PRIMARY KEY, name text, population bigint)"
        )
    yield name
    with psycopg.connect(url) as conn:
        conn.execute(f"DROP TABLE datasets.{name}")


def stored(stack: Stack, table: str) -> list[tuple[Any, ...]]:
    url = stack.database_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url) as conn:
        return conn.execute(f"SELECT * FROM datasets.{table} ORDER BY code").fetchall()


def test_upsert_inserts_then_updates_and_counts_each(
    stack: Stack, server: str, ctx: StepContext, table: str
) -> None:
    rows = call(
        ctx, "data.parse", path=call(ctx, "data.download", url=f"{server}/countries.csv")["path"]
    )
    assert call(ctx, "data.upsert", table=table, rows=rows, keys=["code"]) == {
        "inserted": 3,
        "updated": 0,
        "unchanged": 0,
    }
    changed = [{**rows[0], "population": "68400000"}, rows[1], {"code": "NO", "name": "Norway"}]
    assert call(ctx, "data.upsert", table=table, rows=changed, keys=["code"]) == {
        "inserted": 1,
        "updated": 1,
        "unchanged": 1,
    }
    assert stored(stack, table) == [
        ("FR", "France", 68170000),
        ("GB", "United Kingdom", 68400000),
        ("IS", "Iceland", None),
        ("NO", "Norway", None),
    ]


def test_rows_with_the_same_key_keep_the_last(stack: Stack, ctx: StepContext, table: str) -> None:
    rows = [{"code": "GB", "name": "Britain"}, {"code": "GB", "name": "United Kingdom"}]
    assert call(ctx, "data.upsert", table=table, rows=rows, keys="code")["inserted"] == 1
    assert stored(stack, table) == [("GB", "United Kingdom", None)]


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("Countries", "bad_inputs"),
        ("x; DROP TABLE jobs", "bad_inputs"),
        ("a" * 64, "bad_inputs"),
        ("jobs", "unknown_table"),
        ("no_such_table", "unknown_table"),
    ],
)
def test_a_table_outside_the_allow_list_is_refused(
    stack: Stack, ctx: StepContext, name: str, reason: str
) -> None:
    error = refused(ctx, "data.upsert", table=name, rows=[{"code": "GB"}], keys=["code"])
    assert (error.details["reason"], error.retryable) == (reason, False)


def test_a_bad_batch_stores_nothing(stack: Stack, ctx: StepContext, table: str) -> None:
    rows = [{"code": "GB", "population": "1"}, {"code": "FR", "population": "lots"}]
    error = refused(ctx, "data.upsert", table=table, rows=rows, keys=["code"])
    assert error.details["reason"] == "bad_rows"
    assert stored(stack, table) == []


def test_unknown_columns_and_keys_without_a_unique_constraint_are_refused(
    stack: Stack, ctx: StepContext, table: str
) -> None:
    unknown = refused(ctx, "data.upsert", table=table, rows=[{"code": "GB", "x": 1}], keys="code")
    assert unknown.details["reason"] == "unknown_columns"
    no_key = refused(
        ctx, "data.upsert", table=table, rows=[{"code": "GB", "name": "x"}], keys="name"
    )
    assert no_key.details["reason"] == "no_unique_key"


def test_dedupe_keeps_the_first_item_per_key(ctx: StepContext) -> None:
    items = [{"pmid": "1", "s": "pubmed"}, {"pmid": None}, {"pmid": "1", "s": "epmc"}, {"x": 1}]
    assert call(ctx, "data.dedupe", items=items, key="pmid") == [{"pmid": "1", "s": "pubmed"}]
