"""The data store behind ``data.download`` and ``data.parse``: a shared directory and an S3
bucket on a local S3-compatible server (moto's), each reached by the real client code, and
two workers with data directories of their own that share the store."""

import hashlib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from service.actions import REGISTRY, StepContext, load_plugins
from service.platform.errors import ActionError
from service.platform.objectstore import bucket_store
from service.platform.settings import Settings
from tests.service.actions import make_ctx
from tests.support.files import CSV, S3_KEYS, bucket_keys, create_bucket, file_server, s3_server

Worker = Callable[..., StepContext]
"""A worker's context on its own host (its own data directory), sharing the store."""


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with file_server() as url:
        yield url


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with s3_server() as url:
        yield url


@pytest.fixture(scope="module", autouse=True)
def _builtins() -> None:
    load_plugins(REGISTRY, [], entry_points=[])


@pytest.fixture
def credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the secrets' environment source, as an operator's secrets would come."""
    monkeypatch.setenv("FLOWBEAT_SECRET_DATA_STORE_ACCESS_KEY_ID", S3_KEYS["access_key_id"])
    monkeypatch.setenv("FLOWBEAT_SECRET_DATA_STORE_SECRET_ACCESS_KEY", S3_KEYS["secret_access_key"])


@pytest.fixture(params=["path", "file-url", "s3"])
def store(
    request: pytest.FixtureRequest, tmp_path: Path, endpoint: str, credentials: None
) -> tuple[Worker, Callable[[], list[str]]]:
    """A worker maker for the backend, and what the store holds."""
    settings: dict[str, Any] = {"download_max_bytes": 4096}
    if request.param != "s3":
        shared = tmp_path / "shared"
        settings["data_store"] = f"file://{shared}" if request.param == "file-url" else str(shared)

        def held() -> list[str]:
            return sorted(str(p.relative_to(shared)) for p in shared.rglob("*") if p.is_file())
    else:
        bucket = f"flowbeat-{uuid.uuid4().hex[:12]}"
        create_bucket(endpoint, bucket)
        settings |= {"data_store": f"s3://{bucket}/data", "data_store_endpoint": endpoint}

        def held() -> list[str]:
            return [key.removeprefix("data/") for key in bucket_keys(endpoint, bucket)]

    def worker(name: str = "one", **more: Any) -> StepContext:
        return make_ctx(data_dir=tmp_path / name, **{**settings, **more})

    return worker, held


def call(ctx: StepContext, name: str, **inputs: Any) -> Any:
    return REGISTRY.call(name, ctx, inputs)


def refused(ctx: StepContext, name: str, **inputs: Any) -> ActionError:
    with pytest.raises(ActionError) as info:
        call(ctx, name, **inputs)
    return info.value


def test_a_file_downloaded_by_one_worker_is_parsed_by_another(
    server: str, store: tuple[Worker, Callable[[], list[str]]], tmp_path: Path
) -> None:
    worker, held = store
    digest = hashlib.sha256(CSV).hexdigest()
    out = call(worker("one"), "data.download", url=f"{server}/countries.csv", sha256=digest)
    assert out == {"path": f"downloads/{digest}.csv", "sha256": digest, "bytes": len(CSV)}
    assert held() == [out["path"]]
    assert not (tmp_path / "one").exists(), "nothing went to the worker's own data directory"
    rows = call(worker("two"), "data.parse", path=out["path"])
    assert [row["code"] for row in rows] == ["GB", "FR", "IS"]
    assert rows[2]["population"] is None


@pytest.mark.parametrize(
    ("inputs", "reason"),
    [
        ({"url": "/countries.csv", "sha256": "0" * 64}, "checksum_mismatch"),
        ({"url": "/big.csv"}, "too_large"),
        ({"url": "/big-unsized.csv"}, "too_large"),
    ],
)
def test_a_refused_download_leaves_nothing_in_the_store(
    server: str,
    store: tuple[Worker, Callable[[], list[str]]],
    inputs: dict[str, str],
    reason: str,
) -> None:
    worker, held = store
    error = refused(worker(), "data.download", **{**inputs, "url": server + inputs["url"]})
    assert (error.details["reason"], error.retryable) == (reason, False)
    assert held() == []


def test_a_download_larger_than_the_upload_buffer_streams_whole(
    server: str, store: tuple[Worker, Callable[[], list[str]]]
) -> None:
    """Past obstore's 10 MB buffer, so a bucket gets it as a multipart upload."""
    worker, held = store
    size = 12_000_000
    ctx = worker(download_max_bytes=20_000_000)
    out = call(ctx, "data.download", url=f"{server}/sized/{size}.csv")
    assert out["bytes"] == size
    assert held() == [out["path"]]
    rows = call(worker("two"), "data.parse", path=out["path"], format="csv")
    assert len(rows) == (size - len("n,padding\n")) // 1016
    assert rows[0] == {"n": "1", "padding": "p" * 1013}


def test_a_file_not_in_the_store_fails_with_its_own_code(
    store: tuple[Worker, Callable[[], list[str]]],
) -> None:
    worker, _ = store
    error = refused(worker(), "data.parse", path="downloads/none.csv")
    assert (error.code, error.retryable, error.details["reason"]) == (
        "data_file_missing",
        False,
        "not_found",
    )
    assert "FLOWBEAT_DATA_STORE" in error.message


@pytest.mark.parametrize("path", ["../secret.csv", "/etc/passwd.csv", "a/../../b.csv", "C:/x.csv"])
def test_paths_out_of_the_store_are_refused(
    store: tuple[Worker, Callable[[], list[str]]], path: str
) -> None:
    worker, _ = store
    assert refused(worker(), "data.parse", path=path).details["reason"] == "bad_path"


def test_a_store_that_fails_is_retried_and_shows_no_credential(
    server: str, endpoint: str, credentials: None, tmp_path: Path
) -> None:
    ctx = make_ctx(
        data_dir=tmp_path, data_store="s3://no-such-bucket/x", data_store_endpoint=endpoint
    )
    error = refused(ctx, "data.download", url=f"{server}/countries.csv")
    assert (error.code, error.retryable, error.details["reason"]) == (
        "action_failed",
        True,
        "data_store",
    )
    assert "s3://no-such-bucket/x" in error.message
    for value in S3_KEYS.values():
        assert value not in error.message and value not in str(error.details)


def test_the_credentials_come_from_the_secret_sources_to_the_client_alone(tmp_path: Path) -> None:
    """A mounted secrets directory, as Kubernetes gives one; the S3 server here does not check
    signatures, so the client's configuration is what shows which keys it signs with."""
    (tmp_path / "DATA_STORE_ACCESS_KEY_ID").write_text("AKIAFROMFILE\n")
    (tmp_path / "DATA_STORE_SECRET_ACCESS_KEY").write_text("secret-from-file\n")
    settings = Settings(
        data_store="s3://bucket/prefix",
        data_store_endpoint="https://s3.example.internal",
        secrets_dir=tmp_path,
    )
    store = bucket_store(settings, "s3://bucket/prefix")
    assert store.store.config["access_key_id"] == "AKIAFROMFILE"
    assert store.store.config["secret_access_key"] == "secret-from-file"
    assert (store.name, repr(store.store)) == (
        "s3://bucket/prefix",
        'S3Store(bucket="bucket", prefix="prefix")',
    )
    assert "secret-from-file" not in repr(settings)


@pytest.mark.parametrize(
    ("value", "accepted"),
    [
        ("/mnt/flowbeat", True),
        ("file:///mnt/flowbeat", True),
        ("s3://bucket", True),
        ("s3://bucket/some/prefix", True),
        ("", True),
        ("relative/dir", False),
        ("file://relative", False),
        ("s3://", False),
        ("gs://bucket/x", False),
    ],
)
def test_the_store_setting_is_checked_at_start(value: str, accepted: bool) -> None:
    if accepted:
        assert Settings(data_store=value).data_store == (value or None)
    else:
        with pytest.raises(ValidationError, match="data_store"):
            Settings(data_store=value)
