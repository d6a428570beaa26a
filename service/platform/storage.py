"""What every data store (``service.platform.datastore``) shares, the directory and the bucket
alike: a file is staged and appears whole or not at all, a path is always relative to the
store, and a missing file is ``data_file_missing``.
"""

from contextlib import AbstractContextManager
from pathlib import PurePosixPath, PureWindowsPath
from typing import BinaryIO, Protocol

from service.platform.errors import ActionError, DataFileMissing

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
        raise bad_path(f"{action_name}: path must be a non-empty string", path)
    posix, windows = PurePosixPath(path), PureWindowsPath(path)
    if posix.is_absolute() or windows.is_absolute() or windows.drive or windows.root:
        raise bad_path(f"{action_name}: absolute paths are not allowed: {path!r}", path)
    if ".." in posix.parts or ".." in windows.parts:
        raise bad_path(f"{action_name}: '..' is not allowed in paths: {path!r}", path)
    return posix


def bad_path(message: str, path: object) -> ActionError:
    details = {"reason": "bad_path", **({"path": path} if isinstance(path, str) else {})}
    return ActionError(message, details, retryable=False)


def missing(action_name: str, path: str, store: str) -> DataFileMissing:
    return DataFileMissing(
        f"{action_name}: no file {path!r} in the data store {store}; with workers on more "
        "than one host, FLOWBEAT_DATA_STORE must name a store every worker reaches",
        {"reason": "not_found", "path": path, "store": store},
    )
