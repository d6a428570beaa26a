"""The data store: where ``data.download`` puts files and ``data.parse`` reads them.

A job's steps run wherever a worker is free, so with workers on several hosts a parse runs
where its download may not have. The store is one place every worker reaches
(``FLOWBEAT_DATA_STORE``): a directory each host mounts (a shared volume), or an S3 bucket on
AWS or an S3-compatible server. Steps pass each other a path relative to the store, never a
worker's own path. Unset, the store is ``data_dir``, which is all one machine needs; a
bucket is ``service.platform.objectstore``'s.
"""

import os
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import BinaryIO, Protocol

from service.platform.errors import ActionError, DataFileMissing
from service.platform.settings import Settings

PART_PREFIX = ".part-"


class Writable(Protocol):
    def write(self, data: bytes, /) -> int: ...


class Staged:
    """A file being written: it appears in the store, under the name given to ``commit``, only
    when its block ends without an error, so no reader ever sees part of one."""

    def __init__(self, handle: Writable) -> None:
        self._handle = handle
        self.name: str | None = None

    def write(self, chunk: bytes) -> None:
        self._handle.write(chunk)

    def commit(self, name: str) -> None:
        self.name = name


class DataStore(Protocol):
    name: str
    """How messages show the store: its directory or URL, never a credential."""

    def staging(self, directory: str) -> AbstractContextManager[Staged]: ...

    def reader(self, path: str, action_name: str) -> AbstractContextManager[BinaryIO]: ...


def relative_path(path: object, action_name: str) -> PurePosixPath:
    """``path`` as a path inside a store or directory; absolute paths and ``..`` are refused,
    as a profile, which may come from any user, names it."""
    if not isinstance(path, str) or not path.strip() or "\x00" in path:
        raise _bad_path(f"{action_name}: path must be a non-empty string", path)
    posix, windows = PurePosixPath(path), PureWindowsPath(path)
    if posix.is_absolute() or windows.is_absolute() or windows.drive or windows.root:
        raise _bad_path(f"{action_name}: absolute paths are not allowed: {path!r}", path)
    if ".." in posix.parts or ".." in windows.parts:
        raise _bad_path(f"{action_name}: '..' is not allowed in paths: {path!r}", path)
    return posix


def _bad_path(message: str, path: object) -> ActionError:
    details = {"reason": "bad_path", **({"path": path} if isinstance(path, str) else {})}
    return ActionError(message, details, retryable=False)


def missing(action_name: str, path: str, store: str) -> DataFileMissing:
    return DataFileMissing(
        f"{action_name}: no file {path!r} in the data store {store}; with workers on more "
        "than one host, FLOWBEAT_DATA_STORE must name a store every worker reaches",
        {"reason": "not_found", "path": path, "store": store},
    )


class DirectoryStore:
    """A directory: ``data_dir``, or a volume every worker host mounts at the same path."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.name = str(root)

    @contextmanager
    def staging(self, directory: str) -> Iterator[Staged]:
        target = self.root / directory
        target.mkdir(parents=True, exist_ok=True)
        fd, partial = tempfile.mkstemp(dir=target, prefix=PART_PREFIX)
        try:
            with os.fdopen(fd, "wb") as handle:
                staged = Staged(handle)
                yield staged
            if staged.name is not None:
                os.replace(partial, target / staged.name)
        finally:
            Path(partial).unlink(missing_ok=True)

    @contextmanager
    def reader(self, path: str, action_name: str) -> Iterator[BinaryIO]:
        try:
            target = resolve_under(self.root, path, action_name, "data store")
        except FileNotFoundError:
            raise missing(action_name, path, self.name) from None
        with target.open("rb") as handle:
            yield handle


def resolve_under(base_dir: Path, path: object, action_name: str, base_name: str) -> Path:
    """The regular file ``path`` names under ``base_dir``, or ``FileNotFoundError``; symlinks
    are followed only while they stay inside, so a profile cannot read the worker's files."""
    relative = relative_path(path, action_name)
    base = base_dir.resolve()
    try:
        target = (base / relative).resolve(strict=True)
    except FileNotFoundError:
        raise
    except (OSError, RuntimeError) as exc:
        raise _bad_path(f"{action_name}: cannot resolve {path!r}: {exc}", path) from exc
    if not target.is_relative_to(base):
        raise _bad_path(f"{action_name}: {path!r} resolves outside the {base_name}", path)
    if not target.is_file():
        raise _bad_path(f"{action_name}: {path!r} is not a regular file", path)
    return target


def data_store(settings: Settings) -> DataStore:
    """The store the settings name; made at each use, so that rotated credentials are read.
    The S3 client is imported only where a bucket is the store."""
    url = settings.data_store
    if url is None:
        return DirectoryStore(Path(settings.data_dir))
    if not url.startswith("s3://"):
        return DirectoryStore(Path(url.removeprefix("file://")))
    from service.platform.objectstore import bucket_store

    return bucket_store(settings, url)
